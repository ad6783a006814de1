"""Keeping Python's garbage collector out of the hot loops.

A process that serves or benchmarks holds a large heap of objects that live as long as it
does: torch, the model's modules, tokenizers, pydantic schemas (about 240k objects in the
API process alone). Every full collection scans all of them, and a busy loop allocates
enough to trigger one every few hundred milliseconds: tens of milliseconds of stalled
steps or streams each time. ``gc.freeze()`` moves what exists now out of the collector's
sight; objects made afterwards are collected as usual.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

_open_blocks = 0  # frozen_heap blocks entered and not left
_NEVER = 2**30  # a collection threshold no count reaches
IDLE_COLLECTION_INTERVAL_S = 10.0
BUSY_COLLECTION_INTERVAL_S = 300.0


def freeze_heap() -> None:
    """Collect once, then exempt every surviving object from later collections (for the
    rest of the process: call it once start-up is done).

    At exit the objects are handed back, so that the interpreter's last collection frees
    them (extension modules such as triton's report objects still alive then as leaks)."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)
    atexit.register(gc.unfreeze)


class IdleCollections:
    """A serving process's full collections, held for moments when it is idle: even with
    the start-up heap frozen, they stalled the engine loop mid-burst
    (``benchmarks/results-by-topic/05-step-loop.md``, 5.1). From its
    creation the process runs young collections only; ``collect_if_due`` runs a full one
    when the process is idle and the last was ``IDLE_COLLECTION_INTERVAL_S`` ago, or, under
    a load that never lets up, every ``BUSY_COLLECTION_INTERVAL_S`` (garbage in reference
    cycles that outlived the young generations waits that long). A context manager: the
    thresholds are restored when it ends."""

    _thresholds: tuple[int, int, int]  # restored at exit

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()

    def __enter__(self) -> IdleCollections:
        self._thresholds = gc.get_threshold()
        young, middle, _ = self._thresholds
        gc.set_threshold(young, middle, _NEVER)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.set_threshold(*self._thresholds)

    def collect_if_due(self, idle: bool) -> bool:
        """Run a full collection if one is due; returns whether it ran."""
        interval = IDLE_COLLECTION_INTERVAL_S if idle else BUSY_COLLECTION_INTERVAL_S
        if self._clock() - self._last < interval:
            return False
        gc.collect()
        self._last = self._clock()
        return True


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Exempt every object that exists now from collections during a block (a generation
    loop), and hold full collections until its end; afterwards all is collectable again.
    Unlike ``freeze_heap`` it does not collect first (a full collection is the pause it
    avoids): garbage frozen with the heap waits for the block's end. Full collections wait
    too (they still stall a step with the heap frozen); the young generations are still
    collected. Blocks nest (the outermost one freezes and unfreezes).

    It keeps its own count rather than asking ``gc.get_freeze_count()``: a library may have
    frozen objects of its own, which is not a frozen heap. Its end unfreezes everything, so
    it is not for a process that froze its heap for good (``freeze_heap``)."""
    global _open_blocks
    thresholds = gc.get_threshold()
    if _open_blocks == 0:
        gc.freeze()
        gc.set_threshold(thresholds[0], thresholds[1], _NEVER)
    _open_blocks += 1
    try:
        yield
    finally:
        _open_blocks -= 1
        if _open_blocks == 0:
            gc.set_threshold(*thresholds)
            gc.unfreeze()


def give_back_memory() -> None:
    """Free the garbage in reference cycles (with the heap frozen, a full collection scans
    only what came since: about a millisecond in an API process), then give the C
    allocator's free memory back to the system (glibc's ``malloc_trim``; elsewhere, not).
    The allocator keeps what it freed otherwise: after fifty 7 MB request bodies an API
    process kept 0.4 GB (``benchmarks/results-by-topic/09-reliability.md``, 9.4). For a
    thread, once a burst of large requests has ended: the trim holds the allocator's lock,
    not the GIL."""
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc
