"""The sampling kernel's warm-up beside the loading (the step kernels' needs a GPU:
tests/gpu)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from infer.engine.setup import warmup
from infer.engine.setup.warmup import COMPILE_PART, SamplerWarmUp


def test_every_sampling_variant_is_loaded_after_the_compiling_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[Any, ...]] = []

    def sample(logits: torch.Tensor, rows: Any, mask: Any) -> torch.Tensor:
        seen.append((logits.dtype, rows.use_top_p, mask is not None))
        return logits.argmax(-1)

    monkeypatch.setattr(warmup, "sample_filtered", sample)
    warm_up = SamplerWarmUp(64, torch.device("cpu"), torch.bfloat16)
    assert not seen  # the other process compiles; this one loads in ``wait``
    warm_up.wait()
    dtypes, top_p, masked = (torch.bfloat16, torch.float32), (False, True), (False, True)
    assert sorted(seen, key=str) == sorted(
        [(d, p, m) for d in dtypes for p in top_p for m in masked], key=str
    )


def test_the_compiling_process_runs_every_variant_and_logs_its_part() -> None:
    command = [sys.executable, "-m", "infer.engine.setup.warmup", "64", "cpu", "bfloat16"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"start-up: {COMPILE_PART} in " in done.stderr


def test_a_failed_compiling_process_leaves_the_compiles_to_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    warm_up = SamplerWarmUp(-1, torch.device("cpu"), torch.float32)  # no logits of -1 tokens
    with pytest.raises(RuntimeError):  # compiled here instead, it fails here too: raised
        warm_up.wait()
    assert "compiling process ended with 1" in caplog.text


def test_a_failed_compile_is_raised_by_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any) -> None:
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(warmup, "sample_filtered", fail)
    with pytest.raises(RuntimeError, match="ptxas died"):
        SamplerWarmUp(64, torch.device("cpu"), torch.float32).wait()


def test_abandon_stops_the_compiling_process() -> None:
    warm_up = SamplerWarmUp(64, torch.device("cpu"), torch.float32)
    warm_up.abandon()
    assert warm_up._process.returncode is not None
