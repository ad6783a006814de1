"""The Triton kernel variants a stretch of start-up code needs, compiled side by side in
worker processes before the stretch runs.

Triton compiles a variant when a launch first needs it, on the launching thread, and the
launch waits: a cold start's KV-cache profile step and warm-up meet about twenty variants
one after another, up to seconds each. Threads barely help (Triton's front end holds the
GIL; ``benchmarks/results-by-topic/10-host-overheads.md``, 10.8), processes do.
``compile_ahead`` runs a stretch once with every launch of a variant this process has not
built only recorded (Triton's ``jit_cache_hook`` and its specialisation data) and not run;
``CompilerProcesses`` (``infer.kernels.compile_worker``) compile the variants recorded into
the kernel cache; the stretch run for real then loads each from there.

The recording run computes on kernel outputs that were never written: only stretches
whose control flow and indexing do not depend on them may run in it (forward passes over
host-built metadata, a sampling launch), and every rank must run the same stretches (their
collectives run in both runs).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from infer.kernels.jit_log import (
    JIT_LOG,
    KernelVariant,
    describe_specialization,
    loaded_from_cache,
)

logger = logging.getLogger(__name__)
_RECORDING: ContextVar[dict[str, RecordedVariant] | None] = ContextVar(
    "infer_compile_ahead", default=None
)
_install_lock = threading.Lock()
_installed = False
MAX_WORKERS = 8


@dataclass(frozen=True)
class RecordedVariant:
    """A variant a recorded launch needed: Triton's key for it, the kernel's module and
    name, its compile-time constants and argument attributes (readable) and Triton's
    specialisation data."""

    key: str
    module: str
    name: str
    specialization: str
    data: str


class CompilerProcesses:
    """Worker processes (``infer.kernels.compile_worker``) that compile variants for
    ``target`` into the kernel cache of this process's environment, one variant a worker at
    a time, for any thread. They start at once, importing Triton and compiling a trivial
    kernel while the caller goes on."""

    def __init__(self, workers: int, target: tuple[str, int | str, int]) -> None:
        # No GPU there: a CUDA context in each would take memory the KV sizing counts. This
        # process's import path, so the kernels' modules resolve as they do here.
        environment = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
        }
        command = [sys.executable, "-m", "infer.kernels.compile_worker", json.dumps(target)]
        self._workers = [
            subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
            )
            for _ in range(workers)
        ]
        self._idle: queue.SimpleQueue[subprocess.Popen[str]] = queue.SimpleQueue()
        for worker in self._workers:
            self._idle.put(worker)
        self._live = workers
        self._lock = threading.Lock()

    @classmethod
    def for_device(cls, device: torch.device, ranks_per_host: int = 1) -> CompilerProcesses | None:
        """Workers for this GPU's target (half the cores a rank, at most ``MAX_WORKERS``);
        None without a GPU or without Triton's JIT hook."""
        if device.type != "cuda" or not _install():
            return None
        from triton.runtime import driver

        target = driver.active.get_current_target()
        workers = max(1, min(MAX_WORKERS, (os.cpu_count() or 2) // (2 * ranks_per_host)))
        try:
            return cls(workers, (target.backend, target.arch, target.warp_size))
        except OSError as error:  # the start-up compiles as it goes
            logger.warning("no kernel compiling processes: %r", error)
            return None

    def build(self, variants: list[RecordedVariant]) -> dict[str, dict[str, Any]]:
        """Compile ``variants`` side by side; each one's answer by key (``seconds`` and
        ``cache_hit``, or ``error``)."""
        with ThreadPoolExecutor(len(variants), "infer-compile-ahead") as threads:
            return dict(zip((v.key for v in variants), threads.map(self._build, variants)))

    def _build(self, variant: RecordedVariant) -> dict[str, Any]:
        """One variant on the next idle worker. A worker that dies is not used again; with
        none left, the variant is left to its launch."""
        while True:
            try:
                worker = self._idle.get(timeout=0.5)
                break
            except queue.Empty:
                with self._lock:
                    if not self._live:
                        return {"error": "no compiling process is left"}
        assert worker.stdin is not None and worker.stdout is not None
        task = {"module": variant.module, "name": variant.name, "data": variant.data}
        try:
            worker.stdin.write(json.dumps(task) + "\n")
            worker.stdin.flush()
            line = worker.stdout.readline()
        except OSError:
            line = ""
        if line:
            self._idle.put(worker)
            answer: dict[str, Any] = json.loads(line)
            return answer
        with self._lock:
            self._live -= 1
        return {"error": f"the compiling process exited ({worker.poll()})"}

    def close(self) -> None:
        """End the workers (closing their stdin ends them; a stuck one is killed)."""
        for worker in self._workers:
            if worker.stdin is not None:
                with suppress(OSError):  # a dead worker's unsent task
                    worker.stdin.close()
        for worker in self._workers:
            try:
                worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            if worker.stdout is not None:
                worker.stdout.close()


def compile_ahead(compilers: CompilerProcesses | None, stretch: Callable[[], object]) -> None:
    """Run ``stretch`` with this thread's launches of variants not built yet only recorded,
    then compile those in ``compilers``, each logged in the ``JIT_LOG`` under the caller's
    part. Run the stretch for real afterwards. Without compilers: nothing (the real run
    compiles as it goes)."""
    if compilers is None or not _install():
        return
    recorded: dict[str, RecordedVariant] = {}
    token = _RECORDING.set(recorded)
    try:
        stretch()
    finally:
        _RECORDING.reset(token)
    if not recorded:
        return
    answers = compilers.build(list(recorded.values()))
    part = JIT_LOG.part
    for key, variant in recorded.items():
        answer = answers[key]
        if "error" in answer:
            logger.warning("compiling %s ahead failed: %s", variant.name, answer["error"])
            continue
        seconds = float(answer["seconds"])
        from_cache = loaded_from_cache(seconds, answer.get("cache_hit"))
        built = KernelVariant(variant.name, variant.specialization, seconds, part, from_cache)
        JIT_LOG.built_elsewhere(key, built)


def _install() -> bool:
    """Put the recorder in front of Triton's JIT hook (once, after the ``JIT_LOG``'s hooks);
    False without Triton or its hooks."""
    global _installed
    with _install_lock:
        if not _installed and JIT_LOG.install():
            from triton import knobs

            knobs.runtime.jit_cache_hook = _recording_or(knobs.runtime.jit_cache_hook)
            _installed = True
        return _installed


def _recording_or(previous: Any) -> Any:
    """A hook that, while this thread records, notes the variant and tells Triton to skip
    it (no compile, no launch); otherwise answers as ``previous`` does."""

    def hook(**kwargs: Any) -> Any:
        recorded = _RECORDING.get()
        if recorded is None:
            return previous(**kwargs) if previous is not None else None
        fn, compile = kwargs["fn"], kwargs["compile"]
        key = str(kwargs["key"])
        if key not in recorded:
            recorded[key] = RecordedVariant(
                key, str(fn.module), fn.name, describe_specialization(fn, compile),
                compile["specialization_data"],
            )  # fmt: skip
        return True

    return hook
