"""What the simulator measures in a cache pool, beyond what the engine asks of it.

Every strategy is a pool that satisfies the engine's ``CachePoolProtocol`` and is driven by
the engine's own ``Scheduler``; pools are bookkeeping only (the K/V storage is the runner's),
so simulating a 80 GB GPU costs a few megabytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from infer.cache.prefix import PrefixIndex
from infer.cache.protocol import CachePoolProtocol


@dataclass
class RefusalLog:
    """Allocations a pool refused. One refused although at least as many blocks as it
    needed were free was refused by *external fragmentation*: free memory that could not
    serve it (in a paged pool any free block serves any sequence, so that never happens)."""

    refused: int = 0
    fragmented: int = 0
    stranded_blocks: int = 0  # most free blocks seen at a fragmented refusal since ``take``

    def record(self, needed: int, free: int) -> None:
        self.refused += 1
        if needed <= free:
            self.fragmented += 1
            self.stranded_blocks = max(self.stranded_blocks, free)

    def take_stranded(self) -> int:
        """Free blocks that could not serve a request since the last call (then reset)."""
        stranded, self.stranded_blocks = self.stranded_blocks, 0
        return stranded


class SimulatedPool(CachePoolProtocol, Protocol):
    """A cache pool the simulator can measure after every step."""

    bytes_per_block: int  # memory one of ``num_blocks`` blocks stands for
    refusals: RefusalLog

    def num_sequences(self) -> int:
        """Sequences holding cache (finished ones too, until the scheduler retires them)."""
        ...

    def unused_token_slots(self) -> int:
        """Token positions inside allocated blocks that hold no computed token."""
        ...

    def prefix_blocks_shared(self) -> int:
        """Blocks a new sequence reused from the prefix cache instead of allocating."""
        ...


class TableMeasures:
    """The measurements of a pool that keeps ``PagedKVCachePool``'s page tables."""

    page_tables: dict[int, list[int]]
    seq_lens: dict[int, int]
    block_size: int
    prefix: PrefixIndex | None

    def num_sequences(self) -> int:
        return len(self.page_tables)

    def unused_token_slots(self) -> int:
        # Shared prefix blocks are full, so they add nothing however many tables hold them.
        return sum(
            len(table) * self.block_size - self.seq_lens[seq_id]
            for seq_id, table in self.page_tables.items()
        )

    def prefix_blocks_shared(self) -> int:
        return self.prefix.hits if self.prefix is not None else 0
