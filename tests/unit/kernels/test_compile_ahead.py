"""Compiling the variants a stretch of code launches side by side, driven the way Triton's JIT
calls its hook (no GPU needed: a stand-in kernel records what it is asked to build)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from triton import knobs

from infer.kernels import compile_ahead
from infer.kernels.compile_ahead import compiling_ahead
from infer.kernels.jit_log import JIT_LOG

CPU = torch.device("cpu")


class StandInKernel:
    """Records each ``preload`` (Triton's build from specialisation data) and its thread."""

    def __init__(self, fails: bool = False) -> None:
        self.built: list[tuple[str, str, str]] = []
        self.fails = fails

    def preload(self, specialization: str) -> None:
        if self.fails:
            raise RuntimeError("no compiler here")
        self.built.append((specialization, threading.current_thread().name, JIT_LOG.part))


@pytest.fixture
def triton_hook(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A fresh install in front of a hook that was there before (it answers None and notes
    each key it was asked about)."""
    asked: list[str] = []

    def before(**kwargs: Any) -> None:
        asked.append(kwargs["key"])

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", before)
    monkeypatch.setattr(compile_ahead, "_installed", False)
    return asked


def _launch(kernel: StandInKernel, key: str) -> Any:
    """What Triton's JIT does for a variant it has not built: ask the hook (True: skip)."""
    fn = SimpleNamespace(jit_function=kernel)
    return knobs.runtime.jit_cache_hook(
        key=key, repr="", fn=fn, compile={"key": key, "specialization_data": f"data-{key}"}
    )


def test_launches_within_only_record_and_every_variant_is_built_once_on_exit(
    triton_hook: list[str],
) -> None:
    kernel = StandInKernel()
    with JIT_LOG.running("warm up the step kernels"), compiling_ahead(CPU, threads=2):
        assert _launch(kernel, "a") is True
        assert _launch(kernel, "b") is True
        assert _launch(kernel, "a") is True  # launched again before it is built
        assert kernel.built == []
    assert sorted(data for data, _, _ in kernel.built) == ["data-a", "data-b"]
    assert all(thread.startswith("infer-compile-ahead") for _, thread, _ in kernel.built)
    assert {part for _, _, part in kernel.built} == {"warm up the step kernels"}
    assert triton_hook == []  # skipped launches never reached the hook behind


def test_outside_and_in_other_threads_launches_compile_as_usual(triton_hook: list[str]) -> None:
    kernel = StandInKernel()
    with compiling_ahead(CPU):
        beside = threading.Thread(target=_launch, args=(kernel, "beside"))
        beside.start()
        beside.join()
    assert _launch(kernel, "after") is None
    assert triton_hook == ["beside", "after"]
    assert kernel.built == []


def test_a_variant_that_fails_to_build_ahead_is_left_to_its_launch(
    triton_hook: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    logger = "infer.kernels.compile_ahead"
    with caplog.at_level(logging.WARNING, logger=logger), compiling_ahead(CPU):
        _launch(StandInKernel(fails=True), "a")
    assert "compiling" in caplog.text and "no compiler here" in caplog.text
