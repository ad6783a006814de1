"""The ``naive`` strategy: Lab 0.3's ``NaiveKVCache``, one ``max_seq_len`` region per sequence.

It is the engine's contiguous backend (``SlottedKVCache``): a sequence reserves a whole
slot of ``max_seq_len`` tokens at admission, however short it turns out to be, so most of
the memory it holds is internal fragmentation, and a new sequence waits for a free slot.
"""

from __future__ import annotations

from collections.abc import Sequence

from infer.cache.slotted import SlottedKVCache
from infer.kvsim.pool import RefusalLog, TableMeasures


class NaivePool(TableMeasures, SlottedKVCache):
    """``SlottedKVCache`` with as many ``max_seq_len`` slots as ``num_blocks`` hold."""

    def __init__(
        self, num_blocks: int, block_size: int, bytes_per_block: int, max_seq_len: int
    ) -> None:
        super().__init__(num_blocks, block_size, max_seq_len)
        self.backend = "naive"
        self.bytes_per_block = bytes_per_block
        self.refusals = RefusalLog()

    def allocate_sequence(
        self,
        initial_tokens: int = 0,
        token_ids: Sequence[int] = (),
        known_keys: list[bytes] | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        seq_id = super().allocate_sequence(initial_tokens, token_ids, known_keys, cache_salt)
        if seq_id is None:  # no free slot: a new sequence needs a whole one
            self.refusals.record(self.blocks_per_slot, self.allocator.num_free())
        return seq_id
