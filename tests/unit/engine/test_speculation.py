"""Speculation's parts: n-gram proposals, how many samples stand, the gate that steps aside."""

from __future__ import annotations

import pytest

from infer.engine.speculation import (
    NgramProposer,
    SpeculationGate,
    SpeculationStats,
    accepted_length,
)
from infer.speculative_config import SpeculativeConfig


def _proposer(low: int = 1, high: int = 3) -> NgramProposer:
    spec = SpeculativeConfig(
        num_speculative_tokens=4, prompt_lookup_min=low, prompt_lookup_max=high
    )
    return NgramProposer(spec)


def test_proposes_what_followed_the_latest_earlier_occurrence_of_the_ending() -> None:
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 2, 3]
    assert _proposer().lookup(tokens, 3) == [7, 8, 6]  # [2, 3] last seen before 7


def test_the_longest_matching_ending_wins() -> None:
    tokens = [5, 1, 2, 3, 40, 41, 9, 2, 3, 50, 51, 5, 1, 2, 3]
    # [2, 3] last occurred before 50, but [1, 2, 3] (longer) before 40.
    assert _proposer().lookup(tokens, 2) == [40, 41]


def test_proposals_stop_at_the_end_of_the_sequence_and_at_the_limit() -> None:
    proposer = _proposer()
    assert proposer.lookup([7, 8, 9, 7, 8], 4) == [9, 7, 8]
    assert proposer.lookup([7, 8, 9, 7, 8], 1) == [9]
    assert proposer.lookup([7, 8, 9, 7, 8], 0) == []


def test_no_proposal_without_a_match_or_below_the_shortest_ngram() -> None:
    assert _proposer().lookup([1, 2, 3, 4, 5], 4) == []
    assert _proposer(low=3, high=3).lookup([9, 1, 2, 9, 1, 2, 9, 2], 4) == []
    assert _proposer(low=3, high=3).lookup([1, 2], 4) == []


def test_the_latest_occurrence_with_a_whole_proposal_after_it_is_taken() -> None:
    tokens = [1, 2, 10, 11, 1, 2, 20, 1, 2]
    assert _proposer(2, 2).lookup(tokens, 3) == [20, 1, 2]
    assert _proposer(2, 2).lookup(tokens, 4) == [10, 11, 1, 2]  # three follow the later


def test_a_repeated_token_proposes_its_run() -> None:
    assert _proposer().lookup([4] * 6, 2) == [4, 4]


@pytest.mark.parametrize(
    ("proposals", "samples", "kept"),
    [
        ([], [5], 1),
        ([7, 8], [3, 9, 9], 1),  # the first sample disagrees with the first proposal
        ([7, 8], [7, 9, 9], 2),  # the second does: its sample stands, the rest not
        ([7, 8], [7, 8, 4], 3),  # all agree: the sample after the last proposal too
    ],
)
def test_samples_stand_while_each_proposal_matches_the_sample_before_it(
    proposals: list[int], samples: list[int], kept: int
) -> None:
    assert accepted_length(proposals, samples) == kept


def test_stats_give_the_acceptance_rate_and_the_tokens_a_verification_yields() -> None:
    stats = SpeculationStats()
    assert stats.acceptance_rate == 0.0 and stats.mean_accepted_length == 0.0
    stats.record(4, 3)
    stats.record(4, 1)
    assert stats.acceptance_rate == pytest.approx(0.5)
    assert stats.mean_accepted_length == pytest.approx(3.0)


def test_the_gate_steps_aside_after_steps_that_gain_little_then_tries_again() -> None:
    gate = SpeculationGate(SpeculativeConfig(num_speculative_tokens=4))
    for _ in range(16):
        assert gate.is_open(1)
        gate.record(0)
    assert not gate.is_open(1)
    for _ in range(64):
        gate.tick()
    assert gate.is_open(1)


def test_the_gate_stays_open_while_proposals_pay() -> None:
    gate = SpeculationGate(SpeculativeConfig(num_speculative_tokens=4))
    for step in range(100):
        gate.record(1 if step % 2 else 0)
    assert gate.is_open(1)


def test_the_gate_closes_for_batches_above_disable_by_batch_size() -> None:
    gate = SpeculationGate(SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=8))
    assert gate.is_open(8) and not gate.is_open(9)
