"""Which launches use programmatic dependent launch: CUDA tensors on Hopper or later GPUs,
unless ``INFER_DISABLE_PDL=1``; never the CPU (the interpreter has no grid dependencies)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from infer.kernels import pdl


def _on(device: str) -> Any:
    return SimpleNamespace(device=torch.device(device))


def test_cpu_tensors_launch_without_pdl() -> None:
    assert not pdl.pdl_enabled(torch.zeros(1))


@pytest.mark.parametrize(("major", "disabled", "expected"), [
    (9, None, True), (10, None, True), (8, None, False), (9, "1", False), (9, "0", True),
])  # fmt: skip
def test_cuda_tensors_launch_with_pdl_from_hopper_on_unless_disabled(
    major: int, disabled: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (major, 0))
    pdl._hopper_or_later.cache_clear()
    if disabled is not None:
        monkeypatch.setenv("INFER_DISABLE_PDL", disabled)
    try:
        assert pdl.pdl_enabled(_on("cuda:0")) == expected
    finally:
        pdl._hopper_or_later.cache_clear()
