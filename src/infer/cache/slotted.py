"""Contiguous KV cache: the paged pool with a static reservation.

Slot ``i`` owns blocks ``[i * blocks_per_slot, (i + 1) * blocks_per_slot)`` — room for
``max_seq_len`` tokens — from admission to retirement, so the same storage, metadata and
kernels serve it, and it shows a contiguous cache's internal fragmentation: a short
sequence still holds ``max_seq_len`` worth of cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from infer.cache.paged import PagedKVCachePool
from infer.cache.prefix import root_key


class SlottedKVCache(PagedKVCachePool):
    """``max_batch_size`` slots of ``max_seq_len`` tokens each (``CachePoolProtocol``)."""

    backend = "contiguous"

    def __init__(self, num_blocks: int, block_size: int, max_seq_len: int) -> None:
        super().__init__(num_blocks, block_size, use_prefix_caching=False)
        self.max_seq_len = max_seq_len
        self.blocks_per_slot = math.ceil(max_seq_len / block_size)
        self.num_slots = self.num_blocks // self.blocks_per_slot
        self._free_slots = list(range(self.num_slots - 1, -1, -1))

    @classmethod
    def for_slots(cls, max_batch_size: int, max_seq_len: int, block_size: int) -> SlottedKVCache:
        return cls(max_batch_size * math.ceil(max_seq_len / block_size), block_size, max_seq_len)

    def is_paged(self) -> bool:
        return False

    def allocate_sequence(
        self,
        initial_tokens: int = 0,
        token_ids: Sequence[int] = (),
        known_keys: list[bytes] | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        if initial_tokens > self.max_seq_len or not self._free_slots:
            return None
        slot = self._free_slots.pop()
        first = slot * self.blocks_per_slot
        blocks = list(range(first, first + self.blocks_per_slot))
        self.allocator.allocate_specific(blocks, owner=slot)
        self.page_tables[slot] = blocks
        self.seq_lens[slot] = 0
        self._block_keys[slot] = []
        self._roots[slot] = root_key(None)  # slots share nothing
        self._num_indexed[slot] = 0
        return slot

    def free_sequence(self, slot: int) -> None:
        super().free_sequence(slot)
        self._free_slots.append(slot)

    def prepare_append(self, slot: int, num_tokens: int) -> bool:
        return self.seq_lens[slot] + num_tokens <= self.max_seq_len

    def rewind(self, slot: int, num_tokens: int) -> None:
        self.seq_lens[slot] -= num_tokens  # the slot keeps its blocks

    def free_token_capacity(self) -> int | None:
        return None
