"""The paged strategies are the engine's pool: same allocator, prefix index, ref counts."""

from __future__ import annotations

from infer.cache.allocator import BlockAllocator
from infer.cache.paged import PagedKVCachePool
from infer.config import EngineConfig
from infer.kvsim.footprint import load_footprint
from infer.kvsim.paged import PagedPool
from infer.kvsim.simulator import simulate
from infer.kvsim.trace import make_trace


def test_paged_pool_is_the_engines_without_memory() -> None:
    pool = PagedPool(num_blocks=1 << 20, block_size=16, bytes_per_block=1, use_prefix_caching=True)
    assert isinstance(pool, PagedKVCachePool)
    assert isinstance(pool.allocator, BlockAllocator)
    assert pool.prefix is not None
    assert pool.num_blocks == 1 << 20


def test_refusals_are_never_fragmentation() -> None:
    pool = PagedPool(num_blocks=4, block_size=4, bytes_per_block=1, use_prefix_caching=False)
    seq = pool.allocate_sequence(0, range(12))
    assert pool.prepare_append(seq, 12)
    pool.advance(seq, 12)
    pool.index_blocks(seq, list(range(12)))
    assert not pool.prepare_append(seq, 12)  # needs 3 more blocks, 1 is free
    assert (pool.refusals.refused, pool.refusals.fragmented) == (1, 0)


def test_shared_prefix_blocks_are_shared(memory_only: EngineConfig) -> None:
    trace = make_trace("shared-prefix")
    footprint = load_footprint("llama-3.2-1b")
    memory = 1 << 30
    paged = simulate(trace, "paged", footprint, memory, memory_only)
    prefix = simulate(trace, "paged+prefix", footprint, memory, memory_only)
    assert paged.prefix_blocks_shared == 0
    # Every request after the first finds the 256-token (16-block) system prompt cached.
    assert prefix.prefix_blocks_shared >= 16 * (len(trace.requests) - 2)
    assert prefix.peak_utilization < paged.peak_utilization
    assert prefix.internal_fragmentation >= 0.0


def test_unused_token_slots_count_the_last_block_gaps() -> None:
    pool = PagedPool(num_blocks=16, block_size=4, bytes_per_block=1, use_prefix_caching=False)
    for length in (5, 8, 1):
        seq = pool.allocate_sequence(0, range(length))
        pool.prepare_append(seq, length)
        pool.advance(seq, length)
        pool.index_blocks(seq, list(range(length)))
    assert pool.used_blocks() == 2 + 2 + 1
    assert pool.unused_token_slots() == 3 + 0 + 3
    assert pool.num_sequences() == 3
