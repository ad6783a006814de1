"""How busy a process keeps its CPU, sampled from ``/proc`` (Linux).

A load generator in one Python process has one core for its event loop. When a server
streams faster than the client can parse, the client's measurements describe the client:
how busy it was while the requests ran tells whether it was near that limit."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid``, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


class CpuSampler:
    """Samples a process's CPU time every ``interval_s`` in a thread, from ``start()`` until
    ``stop()`` (or until the process ends)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (wall clock, CPU seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                self.samples.append((time.monotonic(), cpu_seconds(self.pid)))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                return  # the process ended
            if self._stop.wait(self.interval_s):
                return

    def cores_between(self, start: float, end: float) -> float | None:
        """The cores the process kept busy from ``start`` to ``end`` (``time.monotonic``),
        between the first sample at or after ``start`` and the last at or before ``end``;
        None if fewer than two samples fall inside."""
        inside = [(wall, cpu) for wall, cpu in self.samples if start <= wall <= end]
        if len(inside) < 2 or inside[-1][0] == inside[0][0]:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    def peak_cores(self, window_s: float = 1.0) -> float:
        """The most cores the process kept busy over any ``window_s`` of the samples (1.0:
        one core all the time); 0 before two samples that far apart."""
        best = 0.0
        first = 0
        for last, (wall, cpu) in enumerate(self.samples):
            while first < last and wall - self.samples[first + 1][0] >= window_s:
                first += 1
            start_wall, start_cpu = self.samples[first]
            if wall - start_wall >= window_s:
                best = max(best, (cpu - start_cpu) / (wall - start_wall))
        return best
