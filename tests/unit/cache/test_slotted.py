"""The contiguous backend: the paged pool with a static reservation per slot."""

from __future__ import annotations

import pytest

from infer.cache import CachePoolProtocol, PagedKVCachePool, SlottedKVCache


def _slotted(slots: int = 4, max_seq_len: int = 64, block_size: int = 16) -> SlottedKVCache:
    return SlottedKVCache.for_slots(slots, max_seq_len, block_size)


def test_both_pools_satisfy_the_protocol() -> None:
    paged = PagedKVCachePool(4, 16)
    for pool in (paged, _slotted()):
        assert isinstance(pool, CachePoolProtocol)
    assert paged.is_paged() and not _slotted().is_paged()


def test_a_slot_owns_consecutive_blocks_for_max_seq_len() -> None:
    pool = _slotted()
    first, second = pool.allocate_sequence(10), pool.allocate_sequence(10)
    assert pool.block_table(first) == [0, 1, 2, 3]
    assert pool.block_table(second) == [4, 5, 6, 7]
    assert pool.used_blocks() == 8  # reserved, whatever the length


def test_capacity_is_per_slot() -> None:
    pool = _slotted(slots=2)
    assert pool.free_token_capacity() is None
    slot = pool.allocate_sequence()
    assert slot is not None and pool.allocate_sequence() is not None
    assert pool.allocate_sequence() is None  # no free slot
    pool.free_sequence(slot)
    assert pool.allocate_sequence() == slot


def test_growth_is_bounded_by_max_seq_len() -> None:
    pool = _slotted(max_seq_len=64)
    slot = pool.allocate_sequence(60)
    pool.advance(slot, 60)
    pool.index_blocks(slot, list(range(60)))
    assert pool.prepare_append(slot, 4)
    assert not pool.prepare_append(slot, 5)
    assert pool.allocate_sequence(65) is None


def test_short_sequences_show_internal_fragmentation() -> None:
    pool = _slotted(slots=2, max_seq_len=64)
    slot = pool.allocate_sequence(16)
    pool.advance(slot, 16)
    pool.index_blocks(slot, list(range(16)))
    stats = pool.stats()
    assert stats.backend == "contiguous"
    assert stats.internal_fragmentation == pytest.approx(1 - 16 / 64)
    pool.free_sequence(slot)
    assert pool.audit_blocks() == [] and pool.allocator.num_free() == pool.num_blocks


def test_rewinding_a_slot_keeps_its_reservation() -> None:
    pool = _slotted(slots=2, max_seq_len=64, block_size=16)
    slot = pool.allocate_sequence(10)
    assert slot is not None
    pool.advance(slot, 14)
    pool.rewind(slot, 4)
    assert pool.get_seq_len(slot) == 10 and len(pool.block_table(slot)) == 4
    assert pool.audit_blocks() == []
