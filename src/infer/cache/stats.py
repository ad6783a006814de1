"""Memory metrics of a KV cache pool (seed 004): utilisation, fragmentation, rates."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infer.cache.allocator import BlockAllocator


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

    @classmethod
    def measure(
        cls,
        backend: str,
        allocator: BlockAllocator,
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
        return cls(
            backend=backend,
            num_blocks=total,
            block_size=block_size,
            used_blocks=used,
            free_blocks=allocator.num_free(),
            cached_blocks=allocator.num_cached_free(),
            utilization=used / total if total else 0.0,
            internal_fragmentation=1.0 - filled_slots / capacity if capacity else 0.0,
            allocs_per_s=allocator.allocations.rate(),
            frees_per_s=allocator.frees.rate(),
            total_allocations=allocator.allocations.total,
            total_frees=allocator.frees.total,
            evictions=allocator.evictions,
            prefix_hits=prefix_hits,
            prefix_queries=prefix_queries,
            prefix_hit_rate=prefix_hits / prefix_queries if prefix_queries else 0.0,
            leaked_blocks=leaked_blocks,
            active_sequences=active_sequences,
        )

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)
