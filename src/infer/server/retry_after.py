"""``Retry-After`` for a refused request: how long until the queue is likely to have room.

Room appears as sequences finish. The estimate divides the sequences that must finish
before the request fits by the rate at which they finished recently, so a client neither
hammers a server that drains slowly nor waits long on one that drains fast.
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

    def record_finished(self, count: int, now: float | None = None) -> None:
        """``count`` sequences left the server (finished or aborted): room for as many."""
        self._finished.append((time.monotonic() if now is None else now, count))

    def seconds(self, excess: int, now: float | None = None) -> int:
        """Whole seconds until ``excess`` more sequences have likely finished (1 to
        ``max_s``). With none finished recently, the time watched without one."""
        now = time.monotonic() if now is None else now
        while self._finished and self._finished[0][0] < now - self.window_s:
            self._finished.popleft()
        watched = min(self.window_s, now - self._started)
        finished = sum(count for _, count in self._finished)
        wait = watched if finished == 0 else excess * watched / finished
        return max(1, min(self.max_s, math.ceil(wait)))
