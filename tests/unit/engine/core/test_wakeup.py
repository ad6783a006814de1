"""The self-pipe that wakes a blocked engine loop."""

from __future__ import annotations

import threading
import time

from infer.engine.core.wakeup import Wakeup


def test_a_set_from_another_thread_ends_the_wait() -> None:
    wakeup = Wakeup()
    timer = threading.Timer(0.05, wakeup.set)
    start = time.perf_counter()
    timer.start()
    assert wakeup.wait(timeout_s=5.0)
    assert time.perf_counter() - start < 1.0


def test_pending_wakeups_count_once_and_clear() -> None:
    wakeup = Wakeup()
    for _ in range(10_000):  # more than the pipe holds: the rest are dropped
        wakeup.set()
    assert wakeup.wait(timeout_s=0.0)
    assert not wakeup.wait(timeout_s=0.01)
