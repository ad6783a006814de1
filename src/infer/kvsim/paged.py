"""The ``paged`` and ``paged+prefix`` strategies: the engine's ``PagedKVCachePool`` itself.

Blocks come from the project's ``BlockAllocator`` on demand, anywhere in the pool; with
prefix caching, full prompt blocks are shared between sequences through the pool's prefix
index with reference counts (Lab 0.3, 6.4). Only refusals are added, to be measured.
"""

from __future__ import annotations

from collections.abc import Sequence

from infer.cache.paged import PagedKVCachePool
from infer.kvsim.pool import RefusalLog, TableMeasures


class PagedPool(TableMeasures, PagedKVCachePool):
    """``PagedKVCachePool`` over ``num_blocks`` element-less blocks."""

    def __init__(
        self, num_blocks: int, block_size: int, bytes_per_block: int, use_prefix_caching: bool
    ) -> None:
        super().__init__(num_blocks, block_size, use_prefix_caching)
        self.backend = "paged+prefix" if use_prefix_caching else "paged"
        self.bytes_per_block = bytes_per_block
        self.refusals = RefusalLog()

    def prepare_append(self, seq_id: int, num_tokens: int) -> bool:
        if super().prepare_append(seq_id, num_tokens):
            return True
        needed = self._blocks_to_append(seq_id, num_tokens)
        self.refusals.record(needed, self.allocator.num_free())
        return False

    def _blocks_to_append(self, seq_id: int, num_tokens: int) -> int:
        """Blocks ``num_tokens`` more need: new ones, and private copies of shared blocks
        they write into (copy-on-write)."""
        table = self.page_tables[seq_id]
        start = self.seq_lens[seq_id]
        end = self._blocks_for(start + num_tokens)
        written: Sequence[int] = table[start // self.block_size : end]
        return max(end - len(table), 0) + sum(1 for b in written if self._is_shared(b))
