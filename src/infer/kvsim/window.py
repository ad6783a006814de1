"""The ``paged+window`` strategy: blocks wholly outside a sliding window are released.

Lab 0.3's block-sparse attention reads only the last few blocks of a sequence; a layer with
a sliding window (Gemma 3's local layers) never reads anything older, so its K/V there can
be freed. Full-attention layers still need every token, so the pool hands out blocks per
*layer group*: a block of ``block_size`` tokens for ``gcd(full layers, windowed layers)``
layers. Each logical block of a sequence takes ``full_units`` of them that it keeps, and
``window_units`` that go back to the ``BlockAllocator`` once every later query is out of
reach: a query at position ``p`` attends to keys ``p - window < k <= p``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from infer.cache.allocator import BlockAllocator
from infer.cache.block_map import build_block_map
from infer.cache.stats import CacheStats
from infer.contract.engine_view import BlockMap
from infer.kvsim.footprint import KVFootprint
from infer.kvsim.pool import RefusalLog


@dataclass
class _LogicalBlock:
    full: list[int]  # units of the full-attention layers, kept for the sequence's life
    window: list[int]  # units of the windowed layers, emptied once outside the window

    @property
    def units(self) -> list[int]:
        return self.full + self.window


class WindowedPool:
    """A paged pool whose windowed layers keep only the blocks inside their window
    (satisfies ``CachePoolProtocol``; ``num_blocks`` counts layer-group blocks)."""

    backend = "paged+window"

    def __init__(self, footprint: KVFootprint, memory_bytes: int, block_size: int) -> None:
        if not footprint.window_layers or footprint.window < 1:
            raise ValueError("window: the paged+window strategy needs a sliding window")
        group = math.gcd(footprint.full_layers, footprint.window_layers)
        self.full_units = footprint.full_layers // group
        self.window_units = footprint.window_layers // group
        self.units_per_block = self.full_units + self.window_units
        self.window = footprint.window
        self.block_size = block_size
        self.bytes_per_block = block_size * group * footprint.layer_bytes_per_token
        self.num_blocks = memory_bytes // self.bytes_per_block
        self.allocator = BlockAllocator(self.num_blocks)
        self.refusals = RefusalLog()
        self.seq_lens: dict[int, int] = {}
        self._blocks: dict[int, list[_LogicalBlock]] = {}
        self._released: dict[int, int] = {}  # leading logical blocks whose window units are free
        self._next_seq_id = 0

    def is_paged(self) -> bool:
        return True

    def take_copies(self) -> list[tuple[int, int]]:
        return []  # nothing is shared, so nothing is copied before a write

    # --- sequence lifecycle ----------------------------------------------------------
    def allocate_sequence(
        self,
        initial_tokens: int = 0,
        token_ids: Sequence[int] = (),
        known_keys: list[bytes] | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        self.seq_lens[seq_id] = 0
        self._blocks[seq_id] = []
        self._released[seq_id] = 0
        if initial_tokens and not self.prepare_append(seq_id, initial_tokens):
            self.free_sequence(seq_id)
            return None
        return seq_id

    def free_sequence(self, seq_id: int) -> None:
        self.allocator.free(self.block_table(seq_id), owner=seq_id)
        del self.seq_lens[seq_id], self._blocks[seq_id], self._released[seq_id]

    def get_seq_len(self, seq_id: int) -> int:
        return self.seq_lens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        """Every block the sequence holds, logical block by logical block."""
        return [unit for block in self._blocks[seq_id] for unit in block.units]

    def prepare_append(self, seq_id: int, num_tokens: int) -> bool:
        blocks = self._blocks[seq_id]
        new = math.ceil((self.seq_lens[seq_id] + num_tokens) / self.block_size) - len(blocks)
        needed = max(new, 0) * self.units_per_block
        if needed > self.allocator.num_free():
            self.refusals.record(needed, self.allocator.num_free())
            return False
        for _ in range(new):
            units = self.allocator.allocate(self.units_per_block, owner=seq_id)
            blocks.append(_LogicalBlock(units[: self.full_units], units[self.full_units :]))
        return True

    def index_blocks(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """No prefix sharing in this strategy."""

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        """The blocks past the end stay with the sequence, for its next tokens."""
        self.seq_lens[seq_id] -= num_tokens

    def advance(self, seq_id: int, num_tokens: int) -> None:
        """Record the computed tokens and release the windowed layers' blocks that no later
        query can reach."""
        self.seq_lens[seq_id] += num_tokens
        blocks = self._blocks[seq_id]
        released = self._released[seq_id]
        oldest_needed = self.seq_lens[seq_id] - self.window + 1  # first key the next query reads
        while released < len(blocks) and (released + 1) * self.block_size <= oldest_needed:
            self.allocator.free(blocks[released].window, owner=seq_id)
            blocks[released].window = []
            released += 1
        self._released[seq_id] = released

    # --- capacity ------------------------------------------------------------------------
    def used_blocks(self) -> int:
        return self.allocator.num_allocated()

    def free_token_capacity(self) -> int | None:
        """Tokens a new sequence could start with (each of its blocks needs every layer)."""
        return self.allocator.num_free() // self.units_per_block * self.block_size

    # --- measurements ----------------------------------------------------------------------
    def num_sequences(self) -> int:
        return len(self._blocks)

    def unused_token_slots(self) -> int:
        unused = 0
        for seq_id, blocks in self._blocks.items():
            length = self.seq_lens[seq_id]
            for i in range(length // self.block_size, len(blocks)):
                filled = min(max(length - i * self.block_size, 0), self.block_size)
                unused += len(blocks[i].units) * (self.block_size - filled)
        return unused

    def prefix_blocks_shared(self) -> int:
        return 0  # this pool does not index prefixes

    def block_map(self, owners: Sequence[int]) -> BlockMap:
        tables = {seq_id: self.block_table(seq_id) for seq_id in self._blocks}
        return build_block_map(
            self.num_blocks, self.block_size, tables, b"", owners, self.unused_token_slots(), 0
        )

    # --- audits --------------------------------------------------------------------------
    def audit_blocks(self) -> list[int]:
        referenced = {unit for seq_id in self._blocks for unit in self.block_table(seq_id)}
        return self.allocator.find_unreferenced_blocks(referenced)

    def reclaim_leaked_blocks(self) -> int:
        return self.allocator.reclaim(self.audit_blocks())

    def stats(self) -> CacheStats:
        used = self.allocator.num_allocated()
        return CacheStats.measure(
            self.backend,
            self.allocator,
            self.block_size,
            used * self.block_size - self.unused_token_slots(),
            leaked_blocks=len(self.audit_blocks()),
            active_sequences=len(self._blocks),
        )
