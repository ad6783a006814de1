"""The Triton kernel variants a stretch of code needs, compiled side by side instead of one
after another.

Triton compiles a variant when a launch first needs it, on the launching thread, and the
launch waits: a warm-up that meets twenty new variants compiles them one by one. Within
``compiling_ahead`` a launch that needs a variant the process has not built records it
(Triton's own specialisation data, ``jit_cache_hook``) and runs nothing; on exit every
variant recorded is compiled (or loaded from the kernel cache) on a pool of threads, with
``JITFunction.preload``: Triton's compiler releases the GIL for much of its work. The same
stretch run again afterwards finds every variant built.

What runs within computes on kernel outputs that were never written: only code whose
control flow and indexing do not depend on them may (a forward pass over host-built
metadata; not one whose token ids come from a kernel).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

from infer.kernels.jit_log import JIT_LOG

logger = logging.getLogger(__name__)
_RECORDING: ContextVar[dict[str, tuple[Any, str]] | None] = ContextVar(
    "infer_compiling_ahead", default=None
)
_install_lock = threading.Lock()
_installed = False


def _install() -> bool:
    """Put the recorder in front of Triton's JIT hook (once); False without one."""
    global _installed
    with _install_lock:
        if _installed:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = knobs.runtime
        if not hasattr(runtime, "jit_cache_hook"):
            return False
        runtime.jit_cache_hook = _recording_or(runtime.jit_cache_hook)
        _installed = True
        return True


def _recording_or(previous: Any) -> Any:
    """A hook that, while this context records, notes the variant and tells Triton to skip
    it (no compile, no launch); otherwise answers as ``previous`` does."""

    def hook(**kwargs: Any) -> Any:
        recorded = _RECORDING.get()
        if recorded is None:
            return previous(**kwargs) if previous is not None else None
        compile = kwargs["compile"]
        variant = (kwargs["fn"].jit_function, compile["specialization_data"])
        recorded.setdefault(str(kwargs["key"]), variant)
        return True

    return hook


@contextmanager
def compiling_ahead(device: torch.device, threads: int | None = None) -> Iterator[None]:
    """Within: this thread's launches of variants not built yet only record them. On exit
    they are built on ``threads`` threads (default: one a core), each attributed in the
    ``JIT_LOG`` to the part the caller runs. Where Triton has no hook, the stretch simply
    runs (and compiles as it goes)."""
    if not _install():
        yield
        return
    recorded: dict[str, tuple[Any, str]] = {}
    token = _RECORDING.set(recorded)
    try:
        yield
    finally:
        _RECORDING.reset(token)
    if recorded:
        _build(list(recorded.values()), device, threads or os.cpu_count() or 1)


def _build(variants: list[tuple[Any, str]], device: torch.device, threads: int) -> None:
    part = JIT_LOG.part

    def build(variant: tuple[Any, str]) -> None:
        function, specialization = variant
        if device.type == "cuda":
            torch.cuda.set_device(device)  # a thread's current device is the first GPU
        with JIT_LOG.running(part):
            try:
                function.preload(specialization)
            except Exception as error:  # the launch after compiles it as it would have
                logger.warning("compiling %s ahead failed: %r", function, error)

    with ThreadPoolExecutor(min(threads, len(variants)), "infer-compile-ahead") as pool:
        list(pool.map(build, variants))
