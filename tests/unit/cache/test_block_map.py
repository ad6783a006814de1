"""The pool's block map: each block free, evictable, private or shared, with its holder."""

from __future__ import annotations

import numpy as np

from infer.cache.paged import PagedKVCachePool
from infer.cache.slotted import SlottedKVCache
from infer.contract.engine_view import EVICTABLE, FREE, NO_OWNER, PRIVATE, SHARED, BlockMap

PROMPT = list(range(10))  # two full blocks of 4, and two tokens


def _pool(num_blocks: int = 12, prefix: bool = True) -> PagedKVCachePool:
    return PagedKVCachePool(num_blocks, 4, prefix)


def _prefill(pool: PagedKVCachePool, tokens: list[int]) -> int:
    seq = pool.allocate_sequence(0, tokens)
    assert seq is not None
    computed = pool.get_seq_len(seq)
    assert pool.prepare_append(seq, len(tokens) - computed)
    pool.advance(seq, len(tokens) - computed)
    pool.index_blocks(seq, tokens)
    return seq


def _arrays(blocks: BlockMap) -> tuple[list[int], list[int], list[int]]:
    return (
        np.frombuffer(blocks.kind, np.uint8).tolist(),
        np.frombuffer(blocks.refs, np.uint8).tolist(),
        np.frombuffer(blocks.owner, "<u2").tolist(),
    )


def test_a_shared_prefix_is_shared_with_its_reference_count_and_every_holder() -> None:
    pool = _pool()
    first = _prefill(pool, PROMPT)
    second = _prefill(pool, [*PROMPT[:8], 77, 78, 79])
    kind, refs, owner = _arrays(pool.block_map([second, first]))
    assert pool.block_table(first)[:2] == pool.block_table(second)[:2] == [0, 1]
    assert kind[:5] == [SHARED, SHARED, PRIVATE, PRIVATE, FREE]
    assert refs[:5] == [2, 2, 1, 1, 0]
    assert owner[2:5] == [1, 0, NO_OWNER]  # indices into the owners list given
    blocks = pool.block_map([second, first])
    pairs = zip(np.frombuffer(blocks.share_block, "<u4"), np.frombuffer(blocks.share_holder, "<u2"))
    assert sorted((int(b), int(h)) for b, h in pairs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (blocks.used_blocks, blocks.shared_blocks, blocks.evictable_blocks) == (4, 2, 0)


def test_finished_sequences_leave_their_cached_blocks_evictable_until_reused() -> None:
    pool = _pool(num_blocks=3)
    pool.free_sequence(_prefill(pool, PROMPT))
    blocks = pool.block_map([])
    kind, refs, owner = _arrays(blocks)
    assert kind == [EVICTABLE, EVICTABLE, FREE] and refs == [0, 0, 0]
    assert owner == [NO_OWNER] * 3 and blocks.used_blocks == 0
    _prefill(pool, [50 + t for t in range(12)])  # needs every block: evicts both
    blocks = pool.block_map([])
    assert _arrays(blocks)[0] == [PRIVATE] * 3 and blocks.evictions == 2


def test_fragmentation_counts_the_empty_slots_of_used_blocks() -> None:
    pool = _pool(prefix=False)
    _prefill(pool, PROMPT)  # 10 tokens in 3 blocks of 4
    assert pool.block_map([]).internal_fragmentation == 2 / 12


def test_a_contiguous_pool_shows_each_slot_reserved_whole() -> None:
    pool = SlottedKVCache(8, 4, max_seq_len=16)
    slot = pool.allocate_sequence(5)
    assert slot is not None
    pool.advance(slot, 5)
    blocks = pool.block_map([slot])
    kind, _, owner = _arrays(blocks)
    assert kind == [PRIVATE] * 4 + [FREE] * 4 and owner == [0] * 4 + [NO_OWNER] * 4
    assert blocks.internal_fragmentation == 11 / 16
