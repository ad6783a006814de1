"""Memory metrics of a KV cache pool: utilisation, fragmentation, allocation rates."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Protocol


class BlockCounts(Protocol):
    """What a snapshot reads off an allocator (``BlockAllocator``)."""

    total_blocks: int
    total_allocations: int
    total_frees: int
    evictions: int

    def num_allocated(self) -> int: ...

    def num_free(self) -> int: ...

    def num_cached_free(self) -> int: ...


class RateWindow:
    """Rates of ever-growing counters over about the last ``window_s`` seconds, worked out
    when they are reported (the counted paths only add to integers)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, tuple[int, ...]]] = deque()

    def per_second(self, totals: tuple[int, ...], now: float | None = None) -> tuple[float, ...]:
        now = time.monotonic() if now is None else now
        if not self._samples:
            self._samples.append((now, tuple(0 for _ in totals)))
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()
        then, before = self._samples[0]
        self._samples.append((now, totals))
        elapsed = max(now - then, 1e-9)
        return tuple((total - old) / elapsed for total, old in zip(totals, before))


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

    @classmethod
    def measure(
        cls,
        backend: str,
        allocator: BlockCounts,
        rates: RateWindow,
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
        allocs_per_s, frees_per_s = rates.per_second(
            (allocator.total_allocations, allocator.total_frees)
        )
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
