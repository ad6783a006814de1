"""The context the KV cache holds: the model's whole context by default, lowered (and said)
where the cache holds less; an explicit one that does not fit names the most that does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from infer import LLM
from infer.config import EngineConfig
from infer.engine.memory import fit_context


def test_a_context_the_cache_holds_is_kept() -> None:
    assert fit_context(EngineConfig(device="cpu"), 4096, 4096) == 4096


def test_the_default_context_is_lowered_to_what_the_cache_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="infer.engine.memory"):
        assert fit_context(EngineConfig(device="cpu"), 131072, 20000) == 20000
    assert "max_seq_len: 20000" in caplog.text and "131072" in caplog.text


def test_an_explicit_context_that_does_not_fit_names_the_most_that_fits() -> None:
    config = EngineConfig(device="cpu", max_seq_len=8192)
    with pytest.raises(ValueError, match=r"^max_seq_len: 8192 tokens .* at most 4096"):
        fit_context(config, 8192, 4096)


def test_an_engine_serves_the_models_whole_context_by_default(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    path = str(tiny_checkpoint("llama"))  # max_position_embeddings 512
    assert LLM(path, num_gpu_blocks=64).engine.max_seq_len == 512
    assert LLM(path, num_gpu_blocks=8).engine.max_seq_len == 8 * 16  # what 8 blocks hold
    with pytest.raises(ValueError, match=r"^max_seq_len: 256 tokens .* at most 128"):
        LLM(path, num_gpu_blocks=8, max_seq_len=256)
