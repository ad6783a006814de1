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
import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_heap() -> None:
    """Collect once, then exempt every surviving object from later collections (for the
    rest of the process: call it once start-up is done).

    At exit the objects are handed back, so that the interpreter's last collection frees
    them (extension modules such as triton's report objects still alive then as leaks)."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)
    atexit.register(gc.unfreeze)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Exempt every object that exists now from collections during a block (a generation
    loop); afterwards they are collectable again. Unlike ``freeze_heap`` it does not
    collect first (a full collection is the pause it avoids): garbage frozen with the heap
    waits for the block's end. Inside a frozen heap (a nested block, a process that froze
    its start-up heap) it changes nothing."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
