"""Recording the variants a stretch of code launches and handing them to compiling
processes, driven the way Triton's JIT calls its hook (no GPU: stand-in compilers answer)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from triton import knobs

from infer.kernels import compile_ahead as compile_ahead_module
from infer.kernels.compile_ahead import RecordedVariant, compile_ahead
from infer.kernels.jit_log import JitLog


class StandInCompilers:
    """Answers each variant as a compiling process would (or with an error)."""

    def __init__(self, error: str | None = None) -> None:
        self.asked: list[list[RecordedVariant]] = []
        self.error = error

    def build(self, variants: list[RecordedVariant]) -> dict[str, dict[str, Any]]:
        self.asked.append(variants)
        if self.error is not None:
            return {v.key: {"error": self.error} for v in variants}
        return {v.key: {"seconds": 1.5, "cache_hit": False} for v in variants}


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> JitLog:
    """A kernel-variant log of the test's own (its hooks not installed)."""
    fresh = JitLog()
    fresh._installed = True
    monkeypatch.setattr(compile_ahead_module, "JIT_LOG", fresh)
    return fresh


@pytest.fixture
def triton_hook(monkeypatch: pytest.MonkeyPatch, log: JitLog) -> list[str]:
    """A fresh install in front of a hook that was there before (it answers None and notes
    each key it was asked about)."""
    asked: list[str] = []

    def before(**kwargs: Any) -> None:
        asked.append(kwargs["key"])

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", before)
    monkeypatch.setattr(compile_ahead_module, "_installed", False)
    return asked


def _launch(key: str) -> Any:
    """What Triton's JIT does for a variant it has not built: ask the hook (True: skip)."""
    params = [SimpleNamespace(name=n) for n in ("X", "BLOCK")]
    fn = SimpleNamespace(
        module="infer.kernels.k", name="_k", jit_function=SimpleNamespace(params=params)
    )
    compile_info = {
        "key": key,
        "constants": {(1,): 64},
        "configs": [{(0,): [["tt.divisibility", 16]]}],
        "specialization_data": f"data-{key}",
    }
    return knobs.runtime.jit_cache_hook(key=key, repr="", fn=fn, compile=compile_info)


def test_a_stretch_only_records_its_launches_and_each_variant_is_compiled_once(
    triton_hook: list[str], log: JitLog
) -> None:
    compilers = StandInCompilers()
    launched: list[Any] = []

    def stretch() -> None:
        launched.extend(_launch(key) for key in ("a", "b", "a"))

    with log.running("warm up the step kernels") as built:
        compile_ahead(compilers, stretch)  # type: ignore[arg-type]
    assert launched == [True, True, True]  # skipped: no compile, no launch
    (asked,) = compilers.asked
    assert [(v.key, v.module, v.name, v.data) for v in asked] == [
        ("a", "infer.kernels.k", "_k", "data-a"),
        ("b", "infer.kernels.k", "_k", "data-b"),
    ]
    assert asked[0].specialization == "BLOCK=64, X%16"
    assert triton_hook == []  # skipped launches never reached the hook behind
    assert [v.describe() for v in built] == [
        "_k[BLOCK=64, X%16] compiled in 1.50 s (ahead, in a compiling process)"
    ] * 2
    assert log.variants == built


def test_outside_the_stretch_and_in_other_threads_launches_compile_as_usual(
    triton_hook: list[str],
) -> None:
    compilers = StandInCompilers()

    def stretch() -> None:
        beside = threading.Thread(target=_launch, args=("beside",))
        beside.start()
        beside.join()

    compile_ahead(compilers, stretch)  # type: ignore[arg-type]
    assert _launch("after") is None
    assert triton_hook == ["beside", "after"]
    assert compilers.asked == []  # nothing recorded, nothing to compile


def test_without_compilers_the_stretch_does_not_run() -> None:
    ran: list[bool] = []
    compile_ahead(None, lambda: ran.append(True))
    assert ran == []


def test_a_variant_that_failed_ahead_is_left_to_its_launch(
    triton_hook: list[str], log: JitLog, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="infer.kernels.compile_ahead"):
        compile_ahead(StandInCompilers(error="ptxas died"), lambda: _launch("a"))  # type: ignore[arg-type]
    assert "compiling _k ahead failed: ptxas died" in caplog.text
    assert log.variants == []
