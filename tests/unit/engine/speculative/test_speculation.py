"""Speculation's parts: n-gram proposals, how many samples stand, the gate that keeps
proposals to the requests and batches where they pay."""

from __future__ import annotations

import pytest

from infer.contract.sampling_params import SamplingParams
from infer.contract.speculation_stats import SpeculationStats
from infer.engine.core.request import Request
from infer.engine.speculative.speculation import (
    NgramProposer,
    SpeculationGate,
    VerifyCosts,
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


def _requests(count: int) -> list[Request]:
    return [Request(str(i), [1, 2, 3], 3, SamplingParams(), seed=0) for i in range(count)]


def _gate(shadow: bool = False, **options: object) -> SpeculationGate:
    spec = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, **options)  # type: ignore[arg-type]
    return SpeculationGate(spec, shadow=NgramProposer(spec).lookup if shadow else None)


def test_new_requests_propose_while_a_step_costs_less_than_their_first_gain() -> None:
    gate, requests = _gate(), _requests(2)
    assert gate.limits(requests, 1.05) == [4, 4]
    assert gate.limits(requests, 1.9) == [4, 4]
    assert gate.limits(requests, 2.1) == [0, 0]  # a first gain of 1 token cannot pay 1.1


def test_a_request_whose_proposals_fail_stops_proposing_and_the_others_go_on() -> None:
    gate, (good, bad) = _gate(), _requests(2)
    for _ in range(12):
        gate.record(good, 3)
        gate.record(bad, 0)
    assert gate.limits([good, bad], 1.1) == [4, 0]
    assert gate.gain(bad) < 0.1 < 2.9 < gate.gain(good)


def test_the_step_stops_speculating_when_the_proposing_rows_cannot_pay_for_it() -> None:
    gate, requests = _gate(), _requests(4)
    gate.record(requests[0], 4)  # one row gains 1.9 a step, three gain 0.7
    for request in requests[1:]:
        gate.record(request, 0)
    assert gate.limits(requests, 1.4) == [4, 4, 4, 4]
    assert gate.limits(requests, 1.75) == [0, 0, 0, 0]  # 1.9 < 4 x 0.75: row 0 alone would
    assert gate.limits(requests, 5.0) == [0, 0, 0, 0]  # even five tokens a row cannot pay


def test_batches_above_disable_by_batch_size_or_without_a_graph_do_not_speculate() -> None:
    gate = _gate(disable_by_batch_size=8)
    assert gate.limits(_requests(8), 1.0) == [4] * 8
    assert gate.limits(_requests(9), 1.0) == [0] * 9
    assert gate.limits(_requests(2), None) == [0, 0]


def test_a_stopped_request_resumes_when_its_shadow_proposals_would_be_accepted() -> None:
    gate = _gate(shadow=True)
    (request,) = _requests(1)
    for _ in range(12):
        gate.record(request, 0)
    assert gate.limits([request], 1.1) == [0]
    request.token_ids = [7, 8, 9, 10, 11, 7, 8]
    for token in [9, 10, 11, 7, 8] * 12:
        gate.observe([request])  # proposes 9, 10, 11, 7 in the shadow, then scores it
        request.token_ids.append(token)
    assert gate.limits([request], 1.1) == [4] and gate.gain(request) > 2


def test_shadow_proposals_that_fail_keep_a_request_stopped() -> None:
    gate = _gate(shadow=True)
    (request,) = _requests(1)
    for _ in range(12):
        gate.record(request, 0)
    request.token_ids = [7, 8, 9, 10, 11, 7, 8]
    for token in range(100, 130):
        gate.observe([request])
        request.token_ids.append(token)
    assert gate.limits([request], 1.1) == [0]


def test_without_shadow_proposals_a_stopped_request_tries_again_now_and_then() -> None:
    gate = _gate()
    (request,) = _requests(1)
    for _ in range(12):
        gate.record(request, 0)
    for _ in range(63):
        gate.observe([request])
    assert gate.limits([request], 1.1) == [0]
    gate.observe([request])
    assert gate.limits([request], 1.1) == [4]


def test_verify_costs_come_from_the_smallest_graph_that_holds_the_batch() -> None:
    costs = VerifyCosts({1: 1.02, 8: 1.1, 16: 1.3})
    assert costs.device(1) == 1.02 and costs.device(5) == 1.1 and costs.device(16) == 1.3
    assert costs.device(17) is None
    assert VerifyCosts().device(100) is not None  # unmeasured (the CPU): a default
    assert VerifyCosts(max_rows=64).device(65) is None


def test_shadow_lookups_are_few_a_step_and_each_request_waits_between_them() -> None:
    calls: list[int] = []
    spec = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1)
    gate = SpeculationGate(spec, shadow=lambda tokens, k: calls.append(len(tokens)) or [])
    requests = _requests(5)
    for _ in range(16):
        gate.observe(requests)
    # Steps 8 to 10 look all five up, two a step; the first two again at step 16, 8 after.
    assert len(calls) == 7
