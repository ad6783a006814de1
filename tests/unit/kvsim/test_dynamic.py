"""Contiguous first-fit allocation and the external fragmentation it causes."""

from __future__ import annotations

import numpy as np

from infer.config import EngineConfig
from infer.kvsim.dynamic import FirstFitPool, first_fit
from infer.kvsim.footprint import load_footprint
from infer.kvsim.simulator import simulate
from infer.kvsim.trace import make_trace


def test_first_fit_finds_the_first_long_enough_run() -> None:
    free = np.array([0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=bool)
    assert first_fit(free, 1) == 1
    assert first_fit(free, 3) == 4
    assert first_fit(free, 4) == 8
    assert first_fit(free, 5) is None


def _pool(num_blocks: int = 8) -> FirstFitPool:
    return FirstFitPool(num_blocks, block_size=4, bytes_per_block=1)


def _sequence(pool: FirstFitPool, tokens: int) -> int:
    seq = pool.allocate_sequence(tokens)
    pool.advance(seq, tokens)
    pool.index_blocks(seq, [])
    return seq


def test_lab_diagram_3_2_four_free_blocks_cannot_hold_three() -> None:
    pool = _pool()
    a, _, c, _ = (_sequence(pool, 8) for _ in range(4))  # two blocks each: A B C D
    pool.free_sequence(a)
    pool.free_sequence(c)
    assert pool.allocator.num_free() == 4
    assert pool.allocate_sequence(12) is None  # three contiguous blocks
    assert (pool.refusals.refused, pool.refusals.fragmented) == (1, 1)
    assert pool.refusals.take_stranded() == 4


def test_growth_in_place_then_by_moving() -> None:
    pool = _pool()
    first = _sequence(pool, 4)
    assert pool.prepare_append(first, 4)  # block 1 is free: grows in place
    assert pool.block_table(first) == [0, 1]
    second = _sequence(pool, 4)  # block 2
    assert pool.block_table(second) == [2]
    pool.advance(first, 4)
    pool.index_blocks(first, [])
    assert pool.prepare_append(first, 1)  # block 2 is taken: moves to 3..5
    assert pool.block_table(first) == [3, 4, 5]
    assert pool.allocator.num_allocated() == 4
    assert pool.audit_blocks() == []
    pool.free_sequence(first)
    pool.free_sequence(second)
    assert pool.allocator.num_free() == 8


def test_churn_fragments_dynamic_but_never_paged(memory_only: EngineConfig) -> None:
    trace = make_trace("churn", num_requests=40)
    footprint = load_footprint("llama-3.2-1b")
    memory = 256 * footprint.block_bytes(16)
    dynamic = simulate(trace, "dynamic", footprint, memory, memory_only)
    paged = simulate(trace, "paged", footprint, memory, memory_only)
    assert dynamic.fragmentation_refusals > 0
    assert dynamic.external_fragmentation > 0.0
    assert paged.external_fragmentation == 0.0
    assert paged.fragmentation_refusals == 0
    assert dynamic.finished == paged.finished == 40
