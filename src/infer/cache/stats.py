"""Memory metrics of a KV cache pool: utilisation, fragmentation, allocation rates."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Protocol


class RateWindow:
    """Rates of ever-growing counters over the last ``window_s`` seconds.

    The counters' owner ``record``s their totals each time they change; the totals of each
    ``resolution_s``-long tick in which they changed are kept for a window. A rate is then
    what the counters gained since a moment ``window_s`` to ``window_s + resolution_s``
    seconds ago (or since they started, counted from zero, for a younger owner), divided
    by the time since that moment: never by less than the window, so a report soon after
    start, or soon after another report, is not inflated by a tiny interval."""

    def __init__(
        self,
        counters: int,
        window_s: float = 10.0,
        resolution_s: float = 0.1,
        now: float | None = None,
    ) -> None:
        self.window_s = window_s
        self.resolution_s = resolution_s
        start = time.monotonic() if now is None else now
        zeros = (0,) * counters
        # (tick, totals at its end) for each tick in which they changed, oldest first. The
        # first is the baseline: the totals at the end of its tick, and until the next
        # one's start. It begins as zero since the tick before the owner started.
        self._ticks: deque[tuple[int, tuple[int, ...]]] = deque([(self._tick(start) - 1, zeros)])

    def record(self, totals: tuple[int, ...], now: float | None = None) -> None:
        """The counters' new totals (call after each change)."""
        now = time.monotonic() if now is None else now
        tick = self._tick(now)
        if self._ticks[-1][0] == tick:
            self._ticks[-1] = (tick, totals)
        else:
            self._ticks.append((tick, totals))
        self._forget(now)

    def per_second(self, now: float | None = None) -> tuple[float, ...]:
        """Each counter's gain per second over the last ``window_s`` seconds (see above)."""
        now = time.monotonic() if now is None else now
        self._forget(now)
        ticks = self._ticks
        _, before = ticks[0]
        since = now - self.window_s
        if len(ticks) > 1:  # the baseline holds until the next change's tick starts
            since = min(since, ticks[1][0] * self.resolution_s)
        elapsed = now - since
        latest = ticks[-1][1]
        return tuple((total - old) / elapsed for total, old in zip(latest, before))

    def _tick(self, at: float) -> int:
        return math.floor(at / self.resolution_s)

    def _forget(self, now: float) -> None:
        """Drop the baseline while the next tick with a change ended a window ago too."""
        ticks = self._ticks
        while len(ticks) > 1 and (ticks[1][0] + 1) * self.resolution_s <= now - self.window_s:
            ticks.popleft()


class BlockCounts(Protocol):
    """What a snapshot reads off an allocator (``BlockAllocator``)."""

    total_blocks: int
    total_allocations: int
    total_frees: int
    evictions: int
    rates: RateWindow  # of (total_allocations, total_frees)

    def num_allocated(self) -> int: ...

    def num_free(self) -> int: ...

    def num_cached_free(self) -> int: ...


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
    allocs_per_s: float  # blocks allocated per second over the last rate_window_s seconds
    frees_per_s: float
    rate_window_s: float
    total_allocations: int
    total_frees: int
    evictions: int
    prefix_hits: int  # blocks reused from the prefix cache
    prefix_queries: int  # full prompt blocks looked up
    prefix_hit_rate: float
    leaked_blocks: int
    active_sequences: int

    @classmethod
    def measure(
        cls,
        backend: str,
        allocator: BlockCounts,
        block_size: int,
        filled_slots: int,
        leaked_blocks: int,
        active_sequences: int,
        prefix_hits: int = 0,
        prefix_queries: int = 0,
    ) -> CacheStats:
        """Snapshot of a pool whose used blocks hold ``filled_slots`` tokens in all."""
        used = allocator.num_allocated()
        capacity = used * block_size
        total = allocator.total_blocks
        allocs_per_s, frees_per_s = allocator.rates.per_second()
        return cls(
            backend=backend,
            num_blocks=total,
            block_size=block_size,
            used_blocks=used,
            free_blocks=allocator.num_free(),
            cached_blocks=allocator.num_cached_free(),
            utilization=used / total if total else 0.0,
            internal_fragmentation=1.0 - filled_slots / capacity if capacity else 0.0,
            allocs_per_s=allocs_per_s,
            frees_per_s=frees_per_s,
            rate_window_s=allocator.rates.window_s,
            total_allocations=allocator.total_allocations,
            total_frees=allocator.total_frees,
            evictions=allocator.evictions,
            prefix_hits=prefix_hits,
            prefix_queries=prefix_queries,
            prefix_hit_rate=prefix_hits / prefix_queries if prefix_queries else 0.0,
            leaked_blocks=leaked_blocks,
            active_sequences=active_sequences,
        )

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)
