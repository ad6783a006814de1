"""The ``dynamic`` strategy: Lab 0.3 chapter 3's on-demand blocks, kept contiguous.

A sequence gets exactly the blocks its tokens need, as they are needed, but they must be
physically consecutive (what an attention kernel without a block table requires). It grows
in place when the blocks after it are free; otherwise it moves (``realloc``) to the first
free run that holds its new size, its old blocks counting as free. When no run is long
enough the allocation is refused even if enough blocks are free in total: external
fragmentation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infer.cache.paged import PagedKVCachePool
from infer.kvsim.pool import RefusalLog, TableMeasures


def first_fit(is_free: np.ndarray, size: int) -> int | None:
    """Start of the first run of ``size`` free blocks, or None."""
    edges = np.diff(np.concatenate(([0], is_free.astype(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    lengths = np.flatnonzero(edges == -1) - starts
    fits = np.flatnonzero(lengths >= size)
    return int(starts[fits[0]]) if fits.size else None


class FirstFitPool(TableMeasures, PagedKVCachePool):
    """Variable-size contiguous allocation with first fit, over the engine's allocator."""

    backend = "dynamic"

    def __init__(self, num_blocks: int, block_size: int, bytes_per_block: int) -> None:
        super().__init__(num_blocks, block_size, use_prefix_caching=False)
        self.bytes_per_block = bytes_per_block
        self.refusals = RefusalLog()
        self._is_free = np.ones(num_blocks, dtype=bool)

    def allocate_sequence(
        self,
        initial_tokens: int = 0,
        token_ids: Sequence[int] = (),
        known_keys: list[bytes] | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        seq_id = super().allocate_sequence(0, token_ids)  # an empty sequence: no blocks yet
        assert seq_id is not None
        if initial_tokens and not self.prepare_append(seq_id, initial_tokens):
            self.free_sequence(seq_id)  # no run of free blocks holds them
            return None
        return seq_id

    def free_sequence(self, seq_id: int) -> None:
        self._is_free[self.page_tables[seq_id]] = True
        super().free_sequence(seq_id)

    def prepare_append(self, seq_id: int, num_tokens: int) -> bool:
        table = self.page_tables[seq_id]
        size = self._blocks_for(self.seq_lens[seq_id] + num_tokens)
        needed = size - len(table)
        if needed <= 0:
            return True
        end = table[-1] + 1 if table else 0
        if table and end + needed <= self.num_blocks and self._is_free[end : end + needed].all():
            self._take(seq_id, list(range(end, end + needed)))
            return True
        candidates = self._is_free.copy()
        candidates[table] = True  # moving may reuse the sequence's own blocks
        start = first_fit(candidates, size)
        if start is None:
            self.refusals.record(needed, self.allocator.num_free())
            return False
        self._is_free[table] = True
        self.allocator.free(table, owner=seq_id)
        table.clear()
        self._take(seq_id, list(range(start, start + size)))
        return True

    def _take(self, seq_id: int, blocks: list[int]) -> None:
        self.allocator.allocate_specific(blocks, owner=seq_id)
        self._is_free[blocks] = False
        self.page_tables[seq_id].extend(blocks)
