"""The kernel-variant log, driven the way Triton's JIT calls its hooks (no GPU needed)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from triton import knobs

from infer.kernels.jit_log import CACHE_LOAD_S, JitLog, KernelVariant, _chained


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _build(log: JitLog, key: str, seconds: float, cache_hit: bool | None = None) -> None:
    """One variant built as Triton reports it: the hook before, ``seconds`` (with Triton's
    compilation listener told whether the disk cache held it, unless None), the hook after."""
    clock = log._clock
    assert isinstance(clock, Clock)
    params = [SimpleNamespace(name=n) for n in ("logits_ptr", "stride", "vocab", "BLOCK")]
    fn = SimpleNamespace(name="_sample_kernel", jit_function=SimpleNamespace(params=params))
    compile_info: dict[str, Any] = {
        "key": key,
        "constants": {(3,): 1024, (2,): 1},
        "configs": [{(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}],
    }
    log._before(key=key, repr="", fn=fn, compile=compile_info)
    clock.now += seconds
    if cache_hit is not None:
        log._compiled(src=None, metadata={}, metadata_group={}, times=None, cache_hit=cache_hit)
    log._after(key=key, repr="", fn=fn, compile=compile_info)


def test_each_variant_is_recorded_with_its_part_time_and_specialisation() -> None:
    log = JitLog(Clock())
    with log.running("warm-up: greedy rows") as built:
        _build(log, "a", 2.5)
    _build(log, "b", CACHE_LOAD_S / 10)
    assert [v.part for v in log.variants] == ["warm-up: greedy rows", "start-up"]
    assert built == log.variants[:1]
    variant = built[0]
    assert variant.name == "_sample_kernel" and variant.seconds == 2.5
    assert variant.specialization == "BLOCK=1024, vocab=1, logits_ptr%16, stride%16"
    assert not variant.from_cache and log.variants[1].from_cache
    assert variant.describe() == f"_sample_kernel[{variant.specialization}] compiled in 2.50 s"


def test_a_variant_built_after_ready_is_a_warning_unless_a_start_up_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = JitLog(Clock())
    with caplog.at_level(logging.INFO, logger="infer.kernels.jit_log"):
        _build(log, "a", 1.0)
        assert not caplog.records
        log.mark_ready()
        with log.running("another engine's start-up"):
            _build(log, "b", 1.0)
        assert not caplog.records
        _build(log, "c", 1.5)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "the warm-up missed it" in record.getMessage() and "1.50 s" in record.getMessage()
    assert log.variants[-1].part == "serving"


def test_the_compilation_listener_says_compiled_or_loaded_whatever_the_time() -> None:
    log = JitLog(Clock())
    _build(log, "slow load", 2.0, cache_hit=True)  # e.g. waiting for the GIL beside others
    _build(log, "fast compile", CACHE_LOAD_S / 10, cache_hit=False)
    _build(log, "no listener", CACHE_LOAD_S / 10)  # its answer is not carried over
    assert [v.from_cache for v in log.variants] == [True, False, True]


def test_a_variant_built_ahead_is_logged_once_unless_its_launch_compiles_it_again() -> None:
    log = JitLog(Clock())
    ahead = KernelVariant("_sample_kernel", "BLOCK=1024", 3.0, "start-up", from_cache=False)
    log.built_elsewhere("a", ahead)
    log.built_elsewhere("b", ahead)
    _build(log, "a", 0.5, cache_hit=True)  # its launch loads it from the kernel cache
    _build(log, "a", 0.5, cache_hit=True)  # loaded again later (another engine here): logged
    _build(log, "b", 2.0, cache_hit=False)  # its launch missed the cache
    assert [(v.seconds, v.ahead, v.from_cache) for v in log.variants] == [
        (3.0, True, False), (3.0, True, False), (0.5, False, True), (2.0, False, False),
    ]  # fmt: skip
    assert log.variants[0].describe() == (
        "_sample_kernel[BLOCK=1024] compiled in 3.00 s (ahead, in a compiling process)"
    )


def test_a_layout_it_does_not_know_shows_the_key() -> None:
    log = JitLog()
    fn = SimpleNamespace(name="k")  # no jit_function
    log._before(key="spec-key", fn=fn)
    log._after(key="spec-key", fn=fn, compile={"key": "spec-key"})
    assert log.variants[0].specialization == "spec-key"


def test_hooks_set_before_are_still_called_and_answer() -> None:
    calls: list[str] = []

    def ours(**kwargs: Any) -> None:
        calls.append("ours")

    def theirs(**kwargs: Any) -> bool:
        calls.append("theirs")
        return True

    assert _chained(theirs, ours)(key="k") is True
    assert _chained(None, ours)(key="k") is None
    assert calls == ["ours", "theirs", "ours"]


def test_each_thread_builds_in_its_own_part() -> None:
    log = JitLog(Clock())
    with log.running("load the weights") as main:
        worker = threading.Thread(target=_in_part, args=(log, "compile the sampling kernels"))
        worker.start()
        worker.join()
        _build(log, "b", 1.0)
    assert [v.part for v in log.variants] == ["compile the sampling kernels", "load the weights"]
    assert main == log.variants[1:]
    assert log.part == "start-up"


def _in_part(log: JitLog, part: str) -> None:
    with log.running(part):
        _build(log, "a", 2.0)


def test_install_hooks_tritons_jit_and_its_compilation_listener(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for hooks, name in ((knobs.runtime, "jit_cache_hook"), (knobs.runtime, "jit_post_compile_hook"),
                        (knobs.compilation, "listener")):  # fmt: skip
        monkeypatch.setattr(hooks, name, None)
    log = JitLog(Clock())
    assert log.install() and log.install()  # once
    fn = SimpleNamespace(name="k")
    knobs.runtime.jit_cache_hook(key="a", fn=fn, compile={"key": "a"})
    knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=True)
    knobs.runtime.jit_post_compile_hook(key="a", fn=fn, compile={"key": "a"})
    assert [(v.name, v.from_cache) for v in log.variants] == [("k", True)]
