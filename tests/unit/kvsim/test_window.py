"""paged+window: windowed layers give back blocks no later query can reach."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infer.config import EngineConfig
from infer.kvsim.footprint import KVFootprint, load_footprint
from infer.kvsim.simulator import simulate
from infer.kvsim.trace import Trace, TraceRequest
from infer.kvsim.window import WindowedPool


def _grow(pool: WindowedPool, seq: int, tokens: int) -> None:
    assert pool.prepare_append(seq, tokens)
    pool.advance(seq, tokens)
    pool.index_blocks(seq, [])


def test_blocks_wholly_outside_the_window_are_released() -> None:
    footprint = load_footprint("lab").with_window(32, 16)  # every layer windowed
    pool = WindowedPool(footprint, 64 * footprint.block_bytes(16), 16)
    assert (pool.full_units, pool.window_units, pool.num_blocks) == (0, 1, 64)
    seq = pool.allocate_sequence()
    _grow(pool, seq, 64)
    # The next query (position 64) reads keys 33..64: blocks 0 (0-15) and 1 (16-31) go.
    assert pool.used_blocks() == 2
    _grow(pool, seq, 1)
    assert pool.used_blocks() == 3  # a new block for position 64; 32 is still needed
    _grow(pool, seq, 16)  # position 80: keys from 49 on, so block 2 (32-47) goes too
    assert pool.used_blocks() == 3
    assert pool.audit_blocks() == []
    pool.free_sequence(seq)
    assert pool.allocator.num_free() == 64


def test_gemma_keeps_full_layers_and_windows_the_rest() -> None:
    gemma = load_footprint("gemma-3-1b")  # 4 full layers, 22 with a 512-token window
    pool = WindowedPool(gemma, 1 << 30, 16)
    assert (pool.full_units, pool.window_units) == (2, 11)  # groups of gcd(4, 22) = 2 layers
    assert pool.bytes_per_block * 13 == gemma.block_bytes(16)
    seq = pool.allocate_sequence()
    _grow(pool, seq, 2000)
    blocks, released = 125, (2000 - 512 + 1) // 16
    assert pool.used_blocks() == blocks * 2 + (blocks - released) * 11
    assert pool.unused_token_slots() == 0  # 2000 tokens fill 125 blocks exactly


def test_internal_fragmentation_counts_every_unit_of_a_partial_block() -> None:
    footprint = replace(load_footprint("gemma-3-1b"), window=64)
    pool = WindowedPool(footprint, 1 << 26, 16)
    seq = pool.allocate_sequence()
    _grow(pool, seq, 20)  # block 1 holds 4 of 16 tokens in all 13 units
    assert pool.unused_token_slots() == 12 * 13
    stats = pool.stats()
    assert stats.internal_fragmentation == pytest.approx(12 * 13 / (26 * 16))
    assert stats.active_sequences == 1


def test_refusal_when_the_units_are_missing() -> None:
    footprint = load_footprint("lab").with_window(32, 16)
    pool = WindowedPool(footprint, 2 * footprint.block_bytes(16), 16)
    seq = pool.allocate_sequence()
    assert not pool.prepare_append(seq, 48)
    assert (pool.refusals.refused, pool.refusals.fragmented) == (1, 0)
    assert pool.allocate_sequence(48) is None


def test_window_saves_memory_on_long_sequences(memory_only: EngineConfig) -> None:
    trace = Trace("long", [TraceRequest(0.0, 256, 1500) for _ in range(4)])
    gemma = load_footprint("gemma-3-1b")
    paged = simulate(trace, "paged", gemma, 1 << 30, memory_only)
    windowed = simulate(trace, "paged+window", gemma, 1 << 30, memory_only)
    paged_peak = paged.peak_utilization * paged.num_blocks * paged.bytes_per_block
    window_peak = windowed.peak_utilization * windowed.num_blocks * windowed.bytes_per_block
    assert window_peak < 0.5 * paged_peak
    assert windowed.finished == 4


def test_needs_a_window() -> None:
    with pytest.raises(ValueError, match=r"^window: "):
        WindowedPool(KVFootprint("x", 2, 1, 8, 2, 0), 1 << 20, 16)
