"""Memory metrics of a KV cache pool (seed 004): utilisation, fragmentation, rates."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass


class RateMeter:
    """Counts events and reports their rate over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.total = 0
        self._events: deque[tuple[float, int]] = deque()

    def add(self, count: int, now: float | None = None) -> None:
        if count <= 0:
            return
        self.total += count
        self._events.append((time.monotonic() if now is None else now, count))

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()
        return sum(count for _, count in self._events) / self.window_s


@dataclass
class CacheStats:
    """A snapshot of the pool, as ``LLM.cache_stats()`` and ``/v1/cache/stats`` report it."""

    backend: str
    num_blocks: int
    block_size: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int  # free blocks still holding a reusable prefix
    utilization: float  # used / total blocks
    internal_fragmentation: float  # unused token slots inside used blocks / their capacity
    allocs_per_s: float
    frees_per_s: float
    total_allocations: int
    total_frees: int
    evictions: int
    prefix_hits: int  # blocks reused from the prefix cache
    prefix_queries: int  # full prompt blocks looked up
    prefix_hit_rate: float
    leaked_blocks: int
    active_sequences: int
    preemptions: int = 0

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)
