"""The sampling kernel's warm-up beside the loading, the LM head at every row count (the
step kernels need a GPU: tests/gpu)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from infer.engine.setup import warmup
from infer.engine.setup.warmup import SamplerWarmUp, warm_up_logits


def test_every_sampling_variant_runs_in_threads_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[Any, ...]] = []

    def sample(logits: torch.Tensor, rows: Any, mask: Any) -> torch.Tensor:
        seen.append((logits.dtype, rows.use_top_p, mask is not None))
        return logits.argmax(-1)

    monkeypatch.setattr(warmup, "sample_filtered", sample)
    SamplerWarmUp(64, torch.device("cpu"), torch.bfloat16).wait()
    dtypes, top_p, masked = (torch.bfloat16, torch.float32), (False, True), (False, True)
    assert sorted(seen, key=str) == sorted(
        [(d, p, m) for d in dtypes for p in top_p for m in masked], key=str
    )


def test_a_failed_compile_is_raised_by_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any) -> None:
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(warmup, "sample_filtered", fail)
    with pytest.raises(RuntimeError, match="ptxas died"):
        SamplerWarmUp(64, torch.device("cpu"), torch.float32).wait()


def test_the_logits_run_at_every_row_count_a_step_may_sample() -> None:
    """cuBLAS picks the LM head's kernel by the row count, so each count runs once."""
    seen: list[tuple[int, int, torch.dtype]] = []

    class Head:
        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            seen.append((*hidden.shape, hidden.dtype))
            return hidden

    warm_up_logits(Head(), torch.ones(3, 8, dtype=torch.bfloat16), 40)  # type: ignore[arg-type]
    assert seen == [(count, 8, torch.bfloat16) for count in range(1, 41)]
