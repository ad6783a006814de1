"""The capacity planner answers Lab 0.3's Question 2 and reproduces Phase 6's table."""

from __future__ import annotations

import json

import pytest

from infer.kvsim.footprint import load_footprint
from infer.kvsim.planner import format_plan, format_sweep, plan_capacity, plans_to_json

GiB, MiB = 2**30, 2**20


def test_lab_question_2() -> None:
    plan = plan_capacity(
        load_footprint("lab"), 40 * GiB, avg_tokens=300, users=128, peak_tokens=2000
    )
    assert plan.naive_bytes_per_sequence == 32 * MiB  # Part A: 2048 x 16 KiB
    assert plan.naive_max_sequences == 1280  # Part B (the lab's 1,250 mixes GB and MiB)
    assert plan.paged_bytes_per_sequence == 19 * 16 * 16 * 1024  # 300 tokens in 19 blocks
    assert plan.paged_bytes_for_users == 608 * MiB  # Part C (the lab: 614 MB, unrounded)
    assert plan.naive_bytes_for_users == 4 * GiB
    assert 1 - plan.naive_utilization == pytest.approx(1 - 300 / 2048)  # Part D: ~85% waste
    assert plan.capacity_gain == pytest.approx(8623 / 1280)  # "6-7x more users"
    assert plan.naive_fits_users and plan.paged_fits_users
    assert plan.paged_max_sequences_at_peak == 40 * GiB // (125 * 16 * 16 * 1024)
    text = format_plan(plan)
    assert "32.0 MiB" in text and "1,280" in text and "608.0 MiB" in text


def test_phase_6_capacity_table() -> None:
    """Same budget as 8 contiguous slots of 4096 tokens: 16x/8x/4x/2x/1x."""
    footprint = load_footprint("llama-3.2-3b")
    budget = footprint.weight_bytes + 8 * 4096 * footprint.bytes_per_token
    plans = [
        plan_capacity(footprint, budget, avg, users=1, max_seq_len=4096)
        for avg in (256, 512, 1024, 2048, 4096)
    ]
    assert [p.naive_max_sequences for p in plans] == [8] * 5
    assert [p.paged_max_sequences for p in plans] == [128, 64, 32, 16, 8]
    assert [p.capacity_gain for p in plans] == [16.0, 8.0, 4.0, 2.0, 1.0]
    assert "16.0x" in format_sweep(plans)
    assert [row["paged_max_sequences"] for row in json.loads(plans_to_json(plans))] == [
        128,
        64,
        32,
        16,
        8,
    ]


def test_weights_come_off_first() -> None:
    footprint = load_footprint("llama-3.2-3b")
    plan = plan_capacity(footprint, 40 * GiB, 300, 128, gpu_memory_utilization=0.9)
    assert plan.kv_memory_bytes == int(40 * GiB * 0.9) - footprint.weight_bytes
    assert plan.naive_max_sequences == plan.kv_memory_bytes // (2048 * 114688)
    with pytest.raises(ValueError, match=r"^gpu_memory: .* does not even hold the weights"):
        plan_capacity(footprint, 4 * GiB, 300, 1)


def test_no_naive_sequence_fits() -> None:
    plan = plan_capacity(load_footprint("lab"), 16 * MiB, 100, 1)
    assert plan.naive_max_sequences == 0 and plan.paged_max_sequences > 0
    assert plan.capacity_gain is None
    assert "-" in format_plan(plan)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"avg_tokens": 0}, "avg_tokens"),
        ({"users": 0}, "users"),
        ({"peak_tokens": 100}, "peak_tokens"),
        ({"peak_tokens": 4000}, "peak_tokens"),
        ({"block_size": 0}, "block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_bad_inputs_name_the_flag(kwargs: dict[str, int | float], flag: str) -> None:
    arguments: dict[str, int | float] = {"avg_tokens": 300, "users": 1, **kwargs}
    with pytest.raises(ValueError, match=f"^{flag}: "):
        plan_capacity(load_footprint("lab"), GiB, **arguments)
