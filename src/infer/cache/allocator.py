"""Block allocator: integer block ids, reference counts, owners, LRU reuse of cached blocks.

A block is *free* when its reference count is zero. Free blocks wait in one LRU queue; a
free block may still hold a cached prefix (``cached``), and it is only reused, which evicts
that prefix, once older free blocks are gone. Every operation is O(1) per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from infer.cache.stats import RateWindow


class BlockAllocator:
    """Manages ``total_blocks`` fixed-size KV blocks with ids ``0 .. total_blocks - 1``."""

    def __init__(self, total_blocks: int, on_evict: Callable[[int], None] | None = None) -> None:
        self.total_blocks = total_blocks
        # Free blocks, least recently freed first (the next to be reused).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(total_blocks))
        self._ref_counts = [0] * total_blocks
        self._block_owners: dict[int, set[int]] = {}
        self._cached: set[int] = set()  # free or used blocks registered in a prefix index
        # The same blocks as one byte each (1: cached), for pictures of the whole pool: a
        # long-served pool caches most blocks, too many to convert from the set each time.
        self._cached_mask = bytearray(total_blocks)
        self._on_evict = on_evict
        self.evictions = 0
        self.total_allocations = 0  # blocks handed out, ever
        self.total_frees = 0  # blocks back in the free queue, ever (forced frees aside)
        self.rates = RateWindow(counters=2)  # of the two totals

    # --- allocation -------------------------------------------------------------------
    def allocate(self, count: int, owner: int | None = None) -> list[int]:
        """Take ``count`` free blocks (reference count 1). ``RuntimeError`` if too few."""
        if count > len(self._free):
            raise RuntimeError(f"Cannot allocate {count} blocks: only {len(self._free)} free")
        blocks = [self._free.popitem(last=False)[0] for _ in range(count)]
        for block in blocks:
            if block in self._cached:
                self._cached.discard(block)
                self._cached_mask[block] = 0
                self.evictions += 1
                if self._on_evict is not None:
                    self._on_evict(block)
            self._ref_counts[block] = 1
            self._block_owners[block] = set() if owner is None else {owner}
        self.total_allocations += count
        self._record()
        return blocks

    def allocate_specific(self, block_ids: list[int], owner: int | None = None) -> None:
        """Take these exact free blocks (the contiguous backend's static reservation)."""
        busy = [b for b in block_ids if b not in self._free]
        if busy:
            raise RuntimeError(f"Cannot allocate block {busy[0]}: it is in use")
        for block in block_ids:
            del self._free[block]
            self._ref_counts[block] = 1
            self._block_owners[block] = set() if owner is None else {owner}
        self.total_allocations += len(block_ids)
        self._record()

    def share(self, block: int, owner: int | None = None) -> None:
        """Add a reference to a block (a prefix hit); a free cached block leaves the queue."""
        if self._ref_counts[block] == 0:
            if block not in self._cached:
                raise ValueError(f"Cannot share block {block}: it is free and holds no prefix")
            del self._free[block]
            self._block_owners[block] = set()
        self._ref_counts[block] += 1
        if owner is not None:
            self._block_owners[block].add(owner)

    def free(self, block_ids: Iterable[int], owner: int | None = None) -> None:
        """Drop one reference per block; blocks reaching zero return to the free queue.

        ``ValueError`` if a block is not currently allocated (double free or bad id).
        """
        block_ids = list(block_ids)
        for block in block_ids:
            if not 0 <= block < self.total_blocks or self._ref_counts[block] == 0:
                raise ValueError(
                    f"Cannot free block {block}: not currently allocated "
                    "(double-free or invalid block ID)"
                )
        released = 0
        for block in block_ids:
            self._ref_counts[block] -= 1
            owners = self._block_owners.get(block)
            if owners is not None and owner is not None:
                owners.discard(owner)
            if self._ref_counts[block] == 0:
                self._release(block)
                released += 1
        if released:
            self.total_frees += released
            self._record()

    def _record(self) -> None:
        self.rates.record((self.total_allocations, self.total_frees))

    def _release(self, block: int) -> None:
        self._block_owners.pop(block, None)
        self._free[block] = None  # most recently freed: reused last

    # --- prefix cache bookkeeping ----------------------------------------------------
    def mark_cached(self, block: int) -> None:
        self._cached.add(block)
        self._cached_mask[block] = 1

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    # --- queries -----------------------------------------------------------------------
    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    def num_free(self) -> int:
        """Blocks with no reference (including cached ones waiting to be reused)."""
        return len(self._free)

    def num_allocated(self) -> int:
        return self.total_blocks - len(self._free)

    def num_cached_free(self) -> int:
        """Free blocks that still hold a reusable prefix."""
        return sum(1 for block in self._cached if self._ref_counts[block] == 0)

    def cached_mask(self) -> bytes:
        """One byte per block, 1 where it holds a cached prefix (a copy)."""
        return bytes(self._cached_mask)

    def can_allocate(self, count: int) -> bool:
        return len(self._free) >= count

    def owners(self, block: int) -> set[int]:
        return set(self._block_owners.get(block, ()))

    def allocated_block_ids(self) -> set[int]:
        """A copy of the ids of blocks with at least one reference."""
        return {b for b in range(self.total_blocks) if self._ref_counts[b] > 0}

    # --- leak detection ----------------------------------------------------------------
    def find_leaked_blocks(self, active_owners: set[int]) -> dict[int, list[int]]:
        """Blocks held by owners that are no longer active, grouped by owner."""
        leaked: dict[int, list[int]] = {}
        for block, owners in self._block_owners.items():
            for owner in owners - active_owners:
                leaked.setdefault(owner, []).append(block)
        return leaked

    def find_unreferenced_blocks(self, referenced: set[int]) -> list[int]:
        """Allocated blocks not reachable from ``referenced`` (e.g. the page tables)."""
        return sorted(self.allocated_block_ids() - referenced)

    def reclaim(self, leaked: list[int]) -> int:
        """Force-free blocks an audit found unreachable; returns how many."""
        self.force_free(leaked)
        return len(leaked)

    def force_free(self, block_ids: Iterable[int]) -> None:
        """Return blocks to the free queue whatever their count (leak reclamation)."""
        for block in block_ids:
            if self._ref_counts[block] > 0:
                self._ref_counts[block] = 0
                self._release(block)
