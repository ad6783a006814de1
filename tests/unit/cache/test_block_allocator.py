"""BlockAllocator: the seed-000 allocator test plan plus reference counts and LRU reuse."""

from __future__ import annotations

import pytest

from infer.cache.allocator import BlockAllocator


def test_allocates_until_exhausted() -> None:
    allocator = BlockAllocator(10)
    allocator.allocate(5)
    assert allocator.num_free() == 5
    allocator.allocate(5)
    assert allocator.num_free() == 0
    with pytest.raises(RuntimeError, match="only 0 free"):
        allocator.allocate(1)


def test_freed_blocks_are_reused() -> None:
    allocator = BlockAllocator(3)
    first = allocator.allocate(3)
    allocator.free(first)
    assert allocator.num_free() == 3
    assert set(allocator.allocate(3)) == set(first)


def test_double_free_and_unknown_blocks_raise() -> None:
    allocator = BlockAllocator(10)
    blocks = allocator.allocate(3)
    allocator.free(blocks)
    with pytest.raises(ValueError, match="double-free"):
        allocator.free(blocks)
    allocator.allocate(1)
    never_allocated = next(b for b in range(10) if allocator.ref_count(b) == 0)
    with pytest.raises(ValueError, match=f"block {never_allocated}"):
        allocator.free([never_allocated])
    with pytest.raises(ValueError):
        allocator.free([99])


def test_can_allocate() -> None:
    allocator = BlockAllocator(10)
    allocator.allocate(8)
    assert allocator.can_allocate(2)
    assert not allocator.can_allocate(3)


def test_zero_allocation_and_empty_pool() -> None:
    allocator = BlockAllocator(4)
    assert allocator.allocate(0) == []
    assert allocator.num_free() == 4
    empty = BlockAllocator(0)
    with pytest.raises(RuntimeError):
        empty.allocate(1)
    assert empty.num_free() == 0
    assert empty.can_allocate(0)


def test_owner_tracking() -> None:
    allocator = BlockAllocator(10)
    mine = allocator.allocate(3, owner=42)
    assert all(allocator.owners(b) == {42} for b in mine)
    allocator.free(mine[:2], owner=42)
    assert allocator.owners(mine[0]) == set()
    assert allocator.owners(mine[2]) == {42}
    theirs = allocator.allocate(2, owner=99)
    assert [allocator.owners(b) for b in [mine[2], *theirs]] == [{42}, {99}, {99}]


def test_leak_detection_by_owner() -> None:
    allocator = BlockAllocator(10)
    first = allocator.allocate(5, owner=1)
    second = allocator.allocate(3, owner=2)
    assert allocator.find_leaked_blocks({1}) == {2: second}
    assert allocator.find_leaked_blocks({1, 2}) == {}
    leaked = allocator.find_leaked_blocks(set())
    assert sorted(leaked[1]) == sorted(first) and sorted(leaked[2]) == sorted(second)


def test_unreferenced_blocks() -> None:
    allocator = BlockAllocator(10)
    blocks = allocator.allocate(10)
    assert allocator.find_unreferenced_blocks(set(blocks[:7])) == sorted(blocks[7:])
    assert allocator.find_unreferenced_blocks(set(blocks)) == []
    assert allocator.find_unreferenced_blocks(set()) == sorted(blocks)


def test_force_free() -> None:
    allocator = BlockAllocator(10)
    blocks = allocator.allocate(5, owner=7)
    allocator.force_free(blocks)
    assert allocator.num_free() == 10
    assert all(allocator.owners(b) == set() for b in blocks)
    allocator.force_free(blocks)  # already free: no error
    assert allocator.num_free() == 10


def test_allocated_block_ids_is_a_copy() -> None:
    allocator = BlockAllocator(10)
    blocks = allocator.allocate(5)
    assert allocator.allocated_block_ids() == set(blocks)
    allocator.free(blocks[:2])
    ids = allocator.allocated_block_ids()
    assert ids == set(blocks[2:])
    ids.clear()
    assert allocator.num_allocated() == 3


def test_shared_block_is_freed_by_its_last_reference() -> None:
    allocator = BlockAllocator(4)
    (block,) = allocator.allocate(1, owner=1)
    allocator.share(block, owner=2)
    assert allocator.ref_count(block) == 2 and allocator.owners(block) == {1, 2}
    allocator.free([block], owner=1)
    assert allocator.ref_count(block) == 1 and allocator.num_free() == 3
    allocator.free([block], owner=2)
    assert allocator.num_free() == 4


def test_cached_free_blocks_are_reused_last_and_counted_as_evictions() -> None:
    evicted: list[int] = []
    allocator = BlockAllocator(3, on_evict=evicted.append)
    cached, plain = allocator.allocate(2)
    allocator.mark_cached(cached)
    allocator.free([cached])  # freed first: older in the queue...
    allocator.free([plain])
    assert allocator.num_cached_free() == 1
    assert allocator.cached_mask() == bytes(1 if b == cached else 0 for b in range(3))
    taken = allocator.allocate(2)  # ...so the never-used block and then `cached` go first
    assert cached in taken and evicted == [cached] and allocator.evictions == 1
    assert not allocator.is_cached(cached) and allocator.cached_mask() == bytes(3)


def test_sharing_a_cached_free_block_takes_it_out_of_the_free_queue() -> None:
    allocator = BlockAllocator(2)
    (block,) = allocator.allocate(1)
    allocator.mark_cached(block)
    allocator.free([block])
    assert allocator.num_free() == 2
    allocator.share(block, owner=5)
    assert allocator.num_free() == 1 and allocator.ref_count(block) == 1
    with pytest.raises(ValueError, match="holds no prefix"):
        allocator.share(1 - block)


def test_allocations_and_frees_go_into_the_rate_window() -> None:
    allocator = BlockAllocator(8)
    blocks = allocator.allocate(6)
    allocator.free(blocks[:4])
    allocator.free([blocks[4]], owner=None)
    assert allocator.total_allocations == 6 and allocator.total_frees == 5
    # A young allocator: everything it counted lies inside the 10 s window.
    assert allocator.rates.per_second() == pytest.approx((0.6, 0.5))
