"""Launch pacing: the next step is scheduled just before the step in flight ends, not as soon
as it starts, so that requests arriving meanwhile still join it.

With async scheduling the host queues step N+1 while step N runs, and collects N's samples
after. Scheduled as soon as N+1 starts on the device, N+2 is fixed a whole step before the
device reaches it: a request that arrives in that time waits for N+1 and then for N+2 before
its own step, so a cached prompt's time to first token is about two steps before its own.
The pacer lets the loops that take in requests (the server's engine loop, the benchmark's
driver) sleep until the step in flight is due to end, less the time the host needs to
schedule and queue the next one (the *lead*), and take in requests only then.

Everything is measured on the host's clock, at no cost to the device:

- A step's duration: when the host waits for a step's samples it wakes as the step ends, and
  the step queued behind it starts then. A duration counts only when both ends were seen
  that way (the host waited for both steps); each step shape (tokens, rows) keeps its last
  few, and the shortest is expected, so a late host makes the pacer sleep less, never more.
- The lead: from when the host was ready to schedule (the planned wake-up, or the call when
  it did not sleep) to when the next step was queued, the longest of the last few, plus a
  margin for the sleep's own jitter.

A shape not seen yet, or a host that fell behind (the step had ended before the host waited
for it, so the step in flight started at an unknown time), is not paced: the next step is
queued at once, as without the pacer.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

StepShape = tuple[int, int]  # (tokens, rows)

DURATIONS_KEPT = 4
LEADS_KEPT = 8
FIRST_LEAD_S = 1.0e-3  # before any launch has been timed
MARGIN_S = 0.25e-3


class LaunchPacer:
    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._durations: dict[StepShape, deque[float]] = {}
        self._leads: deque[float] = deque(maxlen=LEADS_KEPT)
        self._inflight_start: float | None = None  # None: unknown (the host fell behind)
        self._ready: float | None = None  # when this round's scheduling could begin

    @property
    def lead_s(self) -> float:
        return (max(self._leads) if self._leads else FIRST_LEAD_S) + MARGIN_S

    def expected_s(self, shape: StepShape) -> float | None:
        """How long a step of ``shape`` is expected to take on the device (None: not seen)."""
        seen = self._durations.get(shape)
        return min(seen) if seen else None

    def wait(self, inflight: StepShape) -> float:
        """Sleep until the step in flight (of shape ``inflight``) is due to end, less the
        lead; returns the time slept (0 when it cannot be paced, or is already late)."""
        now = self._clock()
        expected = self.expected_s(inflight)
        self._ready = now
        if self._inflight_start is None or expected is None:
            return 0.0
        wake = self._inflight_start + expected - self.lead_s
        if wake <= now:
            return 0.0
        self._sleep(wake - now)
        self._ready = wake
        return wake - now

    def launched(self) -> None:
        """The step after the one in flight is queued: the time since ``wait`` became ready
        is one measure of the lead."""
        if self._ready is not None:
            self._leads.append(self._clock() - self._ready)
            self._ready = None

    def collected(self, shape: StepShape, waited: bool, queued_behind: bool) -> None:
        """The host has the samples of a step of ``shape``. ``waited``: it waited for them,
        so this is when the step ended; ``queued_behind``: the next step was already queued,
        so it starts now."""
        now = self._clock()
        if waited and self._inflight_start is not None:
            seen = self._durations.setdefault(shape, deque(maxlen=DURATIONS_KEPT))
            seen.append(now - self._inflight_start)
        self._inflight_start = now if waited and queued_behind else None
