"""Paged KV cache bookkeeping: blocks handed to sequences on demand.

Sequence ``s`` owns the blocks in ``page_tables[s]`` (logical order) and has ``seq_lens[s]``
computed tokens. With prefix caching, full blocks are indexed by content and shared between
sequences with reference counts; a shared block is copied before it is written
(copy-on-write: the copy is listed for the runner, which owns the K/V tensors).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from infer.cache.allocator import BlockAllocator
from infer.cache.block_map import build_block_map
from infer.cache.prefix import BlockKey, PrefixIndex, block_keys, root_key
from infer.cache.stats import CacheStats
from infer.contract.engine_view import BlockMap


class PagedKVCachePool:
    """Block-allocated KV cache bookkeeping (satisfies ``CachePoolProtocol``)."""

    backend = "paged"

    def __init__(self, num_blocks: int, block_size: int, use_prefix_caching: bool = False) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.prefix = PrefixIndex() if use_prefix_caching else None
        self.allocator = BlockAllocator(self.num_blocks, on_evict=self._forget_block)
        self.page_tables: dict[int, list[int]] = {}
        self.seq_lens: dict[int, int] = {}
        # Each sequence's block keys (its owner's list, kept across preemption), the parent
        # of its first block (``root_key``), and how many of its blocks are indexed.
        self._block_keys: dict[int, list[BlockKey]] = {}
        self._roots: dict[int, BlockKey] = {}
        self._num_indexed: dict[int, int] = {}
        self._next_seq_id = 0
        self._copies: list[tuple[int, int]] = []  # copy-on-write, until the runner takes them

    def is_paged(self) -> bool:
        return True

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    # --- sequence lifecycle ----------------------------------------------------------
    def allocate_sequence(
        self,
        initial_tokens: int = 0,
        token_ids: Sequence[int] = (),
        known_keys: list[BlockKey] | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        keys = [] if known_keys is None else known_keys
        root = root_key(cache_salt)
        if self.prefix is not None:
            full = len(token_ids) // self.block_size
            parent = keys[-1] if keys else root
            keys += block_keys(
                token_ids[: full * self.block_size], self.block_size, len(keys), parent
            )
        hits = self.prefix.lookup(keys) if self.prefix is not None else []
        needed = max(self._blocks_for(initial_tokens) - len(hits), 0)
        reclaimed = sum(1 for b in hits if self.allocator.ref_count(b) == 0)
        if needed > self.allocator.num_free() - reclaimed:
            return None
        for block in hits:
            self.allocator.share(block, owner=seq_id)
        self.page_tables[seq_id] = hits + self.allocator.allocate(needed, owner=seq_id)
        # At least one prompt token is always computed: its logits start the generation.
        self.seq_lens[seq_id] = min(len(hits) * self.block_size, max(len(token_ids) - 1, 0))
        self._block_keys[seq_id] = keys
        self._roots[seq_id] = root
        self._num_indexed[seq_id] = len(hits)
        return seq_id

    def free_sequence(self, seq_id: int) -> None:
        blocks = self.page_tables.pop(seq_id)
        del self.seq_lens[seq_id]
        del self._block_keys[seq_id], self._roots[seq_id], self._num_indexed[seq_id]
        # Tail first: the LRU queue then reuses a shared prefix's root block last.
        self.allocator.free(reversed(blocks), owner=seq_id)

    def get_seq_len(self, seq_id: int) -> int:
        return self.seq_lens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        return self.page_tables[seq_id]

    def prepare_append(self, seq_id: int, num_tokens: int) -> bool:
        table = self.page_tables[seq_id]
        start = self.seq_lens[seq_id]
        first = start // self.block_size
        # Only the block holding ``start`` can be shared: shared blocks are full of computed
        # tokens, which happens to a written block only when a whole prompt hit the cache.
        shared = first < len(table) and self._is_shared(table[first])
        new_blocks = max(self._blocks_for(start + num_tokens) - len(table), 0)
        if not new_blocks and not shared:
            return True
        if new_blocks + shared > self.allocator.num_free():
            return False
        if shared:
            table[first] = self._copy_on_write(seq_id, table[first])
        table.extend(self.allocator.allocate(new_blocks, owner=seq_id))
        return True

    def _is_shared(self, block: int) -> bool:
        return self.allocator.ref_count(block) > 1 or self.allocator.is_cached(block)

    def _copy_on_write(self, seq_id: int, block: int) -> int:
        """A private copy of ``block`` for ``seq_id``; the shared original stays intact."""
        (copy,) = self.allocator.allocate(1, owner=seq_id)
        self._copies.append((block, copy))
        self.allocator.free([block], owner=seq_id)
        return copy

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self._copies = self._copies, []
        return copies

    def advance(self, seq_id: int, num_tokens: int) -> None:
        self.seq_lens[seq_id] += num_tokens

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        length = self.seq_lens[seq_id] - num_tokens
        self.seq_lens[seq_id] = length
        # Blocks past the end are this step's own (indexed blocks lie below the old end).
        table = self.page_tables[seq_id]
        kept = self._blocks_for(length)
        if len(table) > kept:
            self.allocator.free(reversed(table[kept:]), owner=seq_id)
            del table[kept:]

    def index_blocks(self, seq_id: int, token_ids: Sequence[int]) -> None:
        if self.prefix is None:
            return
        keys = self._block_keys[seq_id]
        indexed = self._num_indexed[seq_id]
        # Only blocks of known tokens (a verify step's cache runs ahead of them).
        full = min(self.seq_lens[seq_id], len(token_ids)) // self.block_size
        if full <= indexed:
            return
        if len(keys) < full:  # hash only the blocks that filled since (not the whole prefix)
            parent = keys[-1] if keys else self._roots[seq_id]
            new_tokens = token_ids[len(keys) * self.block_size : full * self.block_size]
            keys += block_keys(new_tokens, self.block_size, 0, parent)
        table = self.page_tables[seq_id]
        for i in range(indexed, full):
            if self.prefix.insert(keys[i], table[i]):
                self.allocator.mark_cached(table[i])
        self._num_indexed[seq_id] = full

    def _forget_block(self, block: int) -> None:
        if self.prefix is not None:
            self.prefix.remove(block)

    # --- capacity ------------------------------------------------------------------------
    def used_blocks(self) -> int:
        return self.allocator.num_allocated()

    def free_token_capacity(self) -> int | None:
        return self.allocator.num_free() * self.block_size

    # --- audits --------------------------------------------------------------------------
    def audit_blocks(self) -> list[int]:
        referenced = {b for table in self.page_tables.values() for b in table}
        return self.allocator.find_unreferenced_blocks(referenced)

    def reclaim_leaked_blocks(self) -> int:
        return self.allocator.reclaim(self.audit_blocks())

    def block_map(self, owners: Sequence[int]) -> BlockMap:
        # A shared block is full (only full blocks are indexed), so its slots count once.
        unused = sum(
            len(t) * self.block_size - self.seq_lens[s] for s, t in self.page_tables.items()
        )
        return build_block_map(
            self.num_blocks,
            self.block_size,
            self.page_tables,
            self.allocator.cached_mask(),
            owners,
            unused,
            self.allocator.evictions,
        )

    def stats(self) -> CacheStats:
        filled: dict[int, int] = {}
        for seq_id, table in self.page_tables.items():
            length = self.seq_lens[seq_id]
            for i, block in enumerate(table):
                used = min(max(length - i * self.block_size, 0), self.block_size)
                filled[block] = max(filled.get(block, 0), used)
        prefix = self.prefix
        return CacheStats.measure(
            self.backend,
            self.allocator,
            self.block_size,
            sum(filled.values()),
            leaked_blocks=len(self.audit_blocks()),
            active_sequences=len(self.page_tables),
            prefix_hits=prefix.hits if prefix is not None else 0,
            prefix_queries=prefix.queries if prefix is not None else 0,
        )
