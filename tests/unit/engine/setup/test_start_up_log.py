"""Each part of the start-up is logged with its time and the kernel variants it built."""

from __future__ import annotations

import logging

import pytest

from infer.engine.setup.start_up_log import start_up_part
from infer.kernels.jit_log import JIT_LOG, KernelVariant


def test_a_part_is_timed_and_lists_its_kernel_variants(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(JIT_LOG, "variants", [])
    label = "warm-up: grammar masks"
    variant = KernelVariant("_sample_kernel", "HAS_MASK=True", 1.25, label, from_cache=False)
    beside = KernelVariant("_rms_norm_kernel", "", 0.5, "another thread's part", from_cache=False)
    with caplog.at_level(logging.INFO), start_up_part(label) as part:
        JIT_LOG.variants += [variant, beside]
    assert part.variants == [variant] and part.seconds > 0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("start-up: warm-up: grammar masks in ")
    assert lines[0].endswith("kernel variants: 1 compiled, 0 from the kernel cache")
    assert lines[1] == "  _sample_kernel[HAS_MASK=True] compiled in 1.25 s"


def test_a_worker_rank_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), start_up_part("load the weights", log=False) as part:
        pass
    assert not caplog.records and part.label == "load the weights"
