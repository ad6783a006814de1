"""The naive strategy reproduces Lab 0.3's chapter 2 numbers."""

from __future__ import annotations

from infer.config import EngineConfig
from infer.kvsim.footprint import load_footprint
from infer.kvsim.naive import NaivePool
from infer.kvsim.simulator import simulate
from infer.kvsim.trace import make_trace

GiB = 2**30


def test_lab_batch_of_16_wastes_about_85_percent(memory_only: EngineConfig) -> None:
    trace = make_trace("lab", seed=0)
    result = simulate(trace, "naive", load_footprint("lab"), 16 * GiB, memory_only)
    stored = sum(r.prompt_tokens for r in trace.requests)
    assert result.internal_fragmentation == 1 - stored / (16 * 2048)  # the lab's formula
    assert 0.80 < result.internal_fragmentation < 0.90
    assert result.max_concurrent_sequences == 16


def test_breaking_point_16_gib_holds_512_sequences(memory_only: EngineConfig) -> None:
    """Lab 2.6: 16 GiB, 32 heads x 128 dim, max_len 2048 → 32 MiB each → 512 fit."""
    trace = make_trace("lab", num_requests=600)
    naive = simulate(trace, "naive", load_footprint("lab"), 16 * GiB, memory_only)
    assert naive.max_concurrent_sequences == 512
    assert naive.peak_utilization == 1.0
    assert naive.delayed == 600 - 512  # the rest wait for a slot
    paged = simulate(trace, "paged", load_footprint("lab"), 16 * GiB, memory_only)
    assert paged.max_concurrent_sequences == 600  # paged holds them all at once


def test_a_missing_slot_is_refused_for_a_whole_slot() -> None:
    pool = NaivePool(num_blocks=2 * 8 + 5, block_size=16, bytes_per_block=1, max_seq_len=128)
    assert pool.num_slots == 2
    for _ in range(2):
        pool.allocate_sequence(0, range(20))
    assert pool.allocate_sequence(0, range(20)) is None, "a third slot was handed out"
    # 5 blocks are free and the prompt needs 2, but a naive sequence needs a whole slot.
    assert (pool.refusals.refused, pool.refusals.fragmented) == (1, 0)
    assert pool.used_blocks() == 16
    assert pool.unused_token_slots() == 2 * 128
