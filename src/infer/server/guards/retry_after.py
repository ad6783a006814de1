"""``Retry-After`` for a refused request: how long until capacity frees for this caller.

Room appears as sequences finish, at the rate they finished recently. A refused caller is
not alone: every caller refused before it and told to come back later is ahead of it in a
queue the server does not hold but can count. So each refusal books the next free slot of
that queue, one finish (``1 / rate``) after the slot booked before it, and no sooner than
the excess over capacity takes to finish; ``Retry-After`` is the time until the caller's
slot. (Telling every caller only its own excess, as before, sent 120 clients of a server
with room for 12 back after 1-10 s: they came back together, most were refused again, and
the median one finished after 330 s and 48 retries; see
``benchmarks/results-by-topic/09-reliability.md``, 9.1.)
"""

from __future__ import annotations

import math
import time
from collections import deque


class RetryAfterEstimator:
    def __init__(self, window_s: float = 10.0, max_s: int = 60) -> None:
        self.window_s = window_s
        self.max_s = max_s
        self._started = time.monotonic()
        self._finished: deque[tuple[float, int]] = deque()  # (time, sequences)
        self._last_slot = 0.0  # when the last refused caller was told to come back

    def record_finished(self, count: int, now: float | None = None) -> None:
        """``count`` sequences left the server (finished or aborted): room for as many."""
        self._finished.append((time.monotonic() if now is None else now, count))

    def finish_rate(self, now: float | None = None) -> float | None:
        """Sequences finished per second lately (None: none finished in the window)."""
        now = time.monotonic() if now is None else now
        while self._finished and self._finished[0][0] < now - self.window_s:
            self._finished.popleft()
        finished = sum(count for _, count in self._finished)
        return finished / self._watched(now) if finished else None

    def _watched(self, now: float) -> float:
        return max(min(self.window_s, now - self._started), 1e-3)

    def seconds(self, excess: int, now: float | None = None) -> int:
        """Whole seconds (1 to ``max_s``) until a caller refused now, whose request is
        ``excess`` sequences beyond capacity, is likely to fit: behind the callers refused
        before it, at the recent finish rate. Books that slot. With none finished lately
        there is no rate to book by: every caller is told the time watched without a
        finish (a server that just started has seen none yet; a slow one, none for long)."""
        now = time.monotonic() if now is None else now
        rate = self.finish_rate(now)
        if rate is None:
            return max(1, min(self.max_s, math.ceil(self._watched(now))))
        slot = max(now + excess / rate, self._last_slot + 1 / rate)
        slot = min(slot, now + self.max_s)  # a caller told the most waits no longer
        self._last_slot = slot
        return max(1, min(self.max_s, math.ceil(slot - now)))
