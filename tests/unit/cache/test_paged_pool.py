"""PagedKVCachePool: allocation, growth, audits, prefix sharing and copy-on-write."""

from __future__ import annotations

import pytest

from infer.cache.paged import PagedKVCachePool


def _pool(num_blocks: int = 100, block_size: int = 16, prefix: bool = False) -> PagedKVCachePool:
    return PagedKVCachePool(num_blocks, block_size, prefix)


def test_allocate_slot_reserves_blocks_for_the_prompt() -> None:
    pool = _pool()
    seq = pool.allocate_sequence(initial_tokens=50)
    assert len(pool.block_table(seq)) == 4  # ceil(50 / 16)
    assert pool.get_seq_len(seq) == 0
    empty = pool.allocate_sequence(initial_tokens=0)
    assert pool.block_table(empty) == []


def test_free_slot_returns_blocks_and_forgets_the_sequence() -> None:
    pool = _pool()
    seq = pool.allocate_sequence(initial_tokens=50)
    pool.free_sequence(seq)
    assert pool.allocator.num_free() == 100
    assert seq not in pool.page_tables and seq not in pool.seq_lens
    with pytest.raises(KeyError):
        pool.free_sequence(999)


def test_freeing_one_sequence_keeps_the_others() -> None:
    pool = _pool()
    seqs = [pool.allocate_sequence(n) for n in (10, 40, 70)]
    assert [len(pool.block_table(s)) for s in seqs] == [1, 3, 5]
    kept = {s: list(pool.block_table(s)) for s in (seqs[0], seqs[2])}
    pool.free_sequence(seqs[1])
    assert pool.allocator.num_free() == 100 - 6
    assert {s: pool.block_table(s) for s in kept} == kept


def test_free_token_capacity() -> None:
    pool = _pool()
    pool.allocate_sequence(16 * 10)
    pool.allocate_sequence(16 * 20)
    assert pool.free_token_capacity() == 70 * 16 == 1120


def test_exhaustion_leaves_no_partial_state_and_ids_move_on() -> None:
    pool = _pool(num_blocks=4)
    first = pool.allocate_sequence(48)
    assert pool.allocate_sequence(32) is None
    assert list(pool.page_tables) == [first] and pool.allocator.num_free() == 1
    assert pool.allocate_sequence(16) == first + 2  # the failed attempt consumed an id


def test_block_size_one() -> None:
    pool = _pool(num_blocks=10, block_size=1)
    seq = pool.allocate_sequence(5)
    assert len(pool.block_table(seq)) == 5
    pool.advance(seq, 5)
    pool.index_blocks(seq, list(range(5)))
    assert pool.prepare_append(seq, 1)
    assert len(pool.block_table(seq)) == 6


@pytest.mark.parametrize(("prompt", "blocks_after_one_more"), [(15, 1), (16, 2), (17, 2), (32, 3)])
def test_growth_at_block_boundaries(prompt: int, blocks_after_one_more: int) -> None:
    pool = _pool()
    seq = pool.allocate_sequence(prompt)
    pool.advance(seq, prompt)
    pool.index_blocks(seq, list(range(prompt)))
    assert pool.prepare_append(seq, 1)
    assert len(pool.block_table(seq)) == blocks_after_one_more


def test_prepare_append_fails_without_side_effects() -> None:
    pool = _pool(num_blocks=2)
    seq = pool.allocate_sequence(32)
    pool.advance(seq, 32)
    pool.index_blocks(seq, list(range(32)))
    assert not pool.prepare_append(seq, 1)
    assert len(pool.block_table(seq)) == 2 and pool.get_seq_len(seq) == 32


def test_audit_finds_and_reclaims_leaked_blocks() -> None:
    pool = _pool()
    for n in (10, 20, 30):
        pool.allocate_sequence(n)
    assert pool.audit_blocks() == []
    leaked = pool.allocator.allocate(5, owner=999)
    assert pool.audit_blocks() == sorted(leaked)
    free_before = pool.allocator.num_free()
    assert pool.reclaim_leaked_blocks() == 5
    assert pool.allocator.num_free() == free_before + 5 and pool.audit_blocks() == []


def test_reclaim_after_lost_tracking() -> None:
    pool = _pool()
    seq = pool.allocate_sequence(50)
    blocks = pool.page_tables.pop(seq)
    del pool.seq_lens[seq]
    assert pool.audit_blocks() == sorted(blocks)
    assert pool.reclaim_leaked_blocks() == len(blocks)


def test_prefix_blocks_are_shared_with_reference_counts() -> None:
    pool = _pool(prefix=True)
    prompt = list(range(40))  # two full blocks and a partial one
    first = pool.allocate_sequence(len(prompt), prompt)
    pool.advance(first, len(prompt))
    pool.index_blocks(first, prompt)
    second = pool.allocate_sequence(len(prompt), prompt)
    shared = pool.block_table(first)[:2]
    assert pool.block_table(second)[:2] == shared
    assert pool.block_table(second)[2] != pool.block_table(first)[2]
    assert pool.get_seq_len(second) == 32  # the shared tokens need no computing
    assert [pool.allocator.ref_count(b) for b in shared] == [2, 2]
    pool.free_sequence(first)
    assert [pool.allocator.ref_count(b) for b in shared] == [1, 1]
    pool.free_sequence(second)
    assert pool.stats().cached_blocks == 2 and pool.audit_blocks() == []


def test_a_different_prefix_does_not_match() -> None:
    pool = _pool(prefix=True)
    prompt = list(range(40))
    first = pool.allocate_sequence(40, prompt)
    pool.advance(first, 40)
    pool.index_blocks(first, prompt)
    other = [*prompt[:16], 999, *prompt[17:]]  # differs in the second block
    second = pool.allocate_sequence(40, other)
    assert pool.get_seq_len(second) == 16
    assert pool.block_table(second)[0] == pool.block_table(first)[0]
    assert pool.block_table(second)[1] != pool.block_table(first)[1]


def test_only_sequences_of_the_same_cache_salt_share_blocks() -> None:
    pool = _pool(prefix=True)
    prompt = list(range(40))
    salted = {}
    for salt in (None, "tenant-a", "tenant-b"):
        seq = pool.allocate_sequence(40, prompt, cache_salt=salt)
        assert pool.get_seq_len(seq) == 0, salt  # none shares another salt's blocks
        pool.advance(seq, 40)
        pool.index_blocks(seq, prompt)
        salted[salt] = seq
    for salt, seq in salted.items():
        again = pool.allocate_sequence(40, prompt, cache_salt=salt)
        assert pool.get_seq_len(again) == 32, salt
        assert pool.block_table(again)[:2] == pool.block_table(seq)[:2]


def test_blocks_filled_while_generating_keep_the_salt() -> None:
    """A prompt shorter than a block has no key yet: the blocks its generation fills are
    keyed under its salt all the same."""
    pool = _pool(prefix=True)
    tokens = list(range(20))
    first = pool.allocate_sequence(10, tokens[:10], cache_salt="tenant-a")
    assert pool.prepare_append(first, 10)
    pool.advance(first, 20)
    pool.index_blocks(first, tokens)
    for salt, cached in ((None, 0), ("tenant-b", 0), ("tenant-a", 16)):
        assert pool.get_seq_len(pool.allocate_sequence(20, tokens, cache_salt=salt)) == cached


def test_whole_prompt_hit_recomputes_the_last_token_into_a_copy() -> None:
    pool = _pool(prefix=True)
    prompt = list(range(32))
    first = pool.allocate_sequence(32, prompt)
    pool.advance(first, 32)
    pool.index_blocks(first, prompt)
    second = pool.allocate_sequence(32, prompt)
    assert pool.get_seq_len(second) == 31  # one token still runs, to produce logits
    original = pool.block_table(second)[1]
    assert pool.prepare_append(second, 1)
    copy = pool.block_table(second)[1]
    assert copy != original  # copy-on-write: the runner copies the block before writing
    assert pool.take_copies() == [(original, copy)]
    assert pool.take_copies() == []  # each copy is handed over once
    assert pool.allocator.ref_count(original) == 1  # still the first sequence's, intact


def test_cached_blocks_are_evicted_when_space_is_needed() -> None:
    pool = _pool(num_blocks=3, block_size=4, prefix=True)
    prompt = list(range(8))
    seq = pool.allocate_sequence(8, prompt)
    pool.advance(seq, 8)
    pool.index_blocks(seq, prompt)
    pool.free_sequence(seq)
    assert pool.stats().cached_blocks == 2
    pool.allocate_sequence(12)  # needs every block: both cached ones are evicted
    assert pool.allocator.evictions == 2 and pool.stats().cached_blocks == 0
    assert pool.prefix is not None and len(pool.prefix) == 0


def test_running_sequences_blocks_are_never_evicted() -> None:
    pool = _pool(num_blocks=3, block_size=4, prefix=True)
    prompt = list(range(8))
    running = pool.allocate_sequence(8, prompt)
    pool.advance(running, 8)
    pool.index_blocks(running, prompt)
    assert pool.allocate_sequence(12) is None
    assert pool.allocator.evictions == 0 and len(pool.block_table(running)) == 2


def test_stats_report_utilization_and_internal_fragmentation() -> None:
    pool = _pool(num_blocks=10, block_size=4)
    seq = pool.allocate_sequence(6)  # 2 blocks, 6 of 8 slots will be used
    pool.advance(seq, 6)
    pool.index_blocks(seq, list(range(6)))
    stats = pool.stats()
    assert stats.used_blocks == 2 and stats.utilization == pytest.approx(0.2)
    assert stats.internal_fragmentation == pytest.approx(2 / 8)
    assert stats.leaked_blocks == 0 and stats.active_sequences == 1


def test_rewinding_forgets_rejected_positions_and_frees_blocks_past_the_end() -> None:
    pool = _pool(num_blocks=10, block_size=4, prefix=True)
    prompt = list(range(6))
    seq = pool.allocate_sequence(6, prompt)
    pool.advance(seq, 5)
    assert pool.prepare_append(seq, 5)  # the last prompt token and four proposals
    pool.advance(seq, 5)
    assert pool.get_seq_len(seq) == 10 and len(pool.block_table(seq)) == 3
    pool.rewind(seq, 3)  # one proposal accepted: positions 7-9 are rejected
    assert pool.get_seq_len(seq) == 7 and len(pool.block_table(seq)) == 2
    assert pool.used_blocks() == 2 and pool.audit_blocks() == []
    pool.index_blocks(seq, [*prompt, 40, 41])
    assert pool.allocate_sequence(4, [0, 1, 2, 3]) is not None  # the full block is shared
    assert pool.prefix is not None and pool.prefix.hits == 1
