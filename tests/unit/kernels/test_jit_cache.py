"""Compiled kernels are kept under infer's cache directory, unless Triton's is set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infer.kernels.jit_cache import (
    FLASH_ATTN4_CACHE_ENV,
    FLASH_ATTN4_CACHE_ON_ENV,
    TRITON_CACHE_ENV,
    use_kernel_cache,
)


def test_triton_caches_under_infer_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(TRITON_CACHE_ENV, "recorded, so that the test's own value is undone")
    monkeypatch.delenv(TRITON_CACHE_ENV)
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))
    assert use_kernel_cache() == tmp_path / "triton"
    assert os.environ[TRITON_CACHE_ENV] == str(tmp_path / "triton")


def test_a_triton_cache_dir_the_user_set_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(TRITON_CACHE_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path / "infer"))
    assert use_kernel_cache() == tmp_path / "mine"


def test_flash_attention_4_caches_under_infer_cache_dir_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in (FLASH_ATTN4_CACHE_ENV, FLASH_ATTN4_CACHE_ON_ENV):
        monkeypatch.setenv(name, "recorded, so that the test's own value is undone")
        monkeypatch.delenv(name)
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))
    use_kernel_cache()
    assert os.environ[FLASH_ATTN4_CACHE_ON_ENV] == "1"
    assert os.environ[FLASH_ATTN4_CACHE_ENV] == str(tmp_path / "flash_attn4")
    monkeypatch.setenv(FLASH_ATTN4_CACHE_ON_ENV, "0")
    monkeypatch.setenv(FLASH_ATTN4_CACHE_ENV, str(tmp_path / "mine"))
    use_kernel_cache()
    assert os.environ[FLASH_ATTN4_CACHE_ON_ENV] == "0"
    assert os.environ[FLASH_ATTN4_CACHE_ENV] == str(tmp_path / "mine")
