"""Verify steps end to end on the CPU (the eager path a GPU's graphs replay): n-gram proposals
made on the device change no greedy or seeded output, steps are queued ahead and the token
history follows the cache, and the device-side pieces (rows fed from the step before, how
many proposals stand)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from infer import LLM, SamplingParams
from infer.engine.verify_step import accept, plan_rows
from infer.kernels.verify_inputs import ProposalMode

NGRAM = {"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
OPTIONS: dict[str, Any] = {"num_gpu_blocks": 256, "max_seq_len": 256, "block_size": 4}


def test_rows_fed_from_a_verify_step_start_past_what_it_accepted() -> None:
    samples, accepted = torch.tensor([50, 60, 70]), torch.tensor([2, 0, 3])
    rows = plan_rows(
        [5, 0, 0], [9, 20, 30], [3, 3, 0], [(1, 2), (2, 0)], (samples, accepted),
        ProposalMode.NGRAM, torch.device("cpu"),
    )  # fmt: skip
    starts = rows.starts
    assert starts.first.tolist() == [5, 70, 50] and starts.base.tolist() == [9, 23, 32]
    assert rows.extra.tolist() == [0, 3, 2] and starts.limit.tolist() == [3, 3, 0]
    assert starts.num_rows.tolist() == [3] and starts.mode.tolist() == [0]
    plain = plan_rows(
        [0], [9], [3], [(0, 1)], (samples, None), ProposalMode.NGRAM, torch.device("cpu")
    )
    assert plain.starts.first.tolist() == [60] and plain.starts.base.tolist() == [9]


def test_proposals_stand_while_each_equals_the_sample_before_it() -> None:
    samples = torch.tensor([6, 7, 9, 1, 5, 4, 4, 4, 8, 2, 3, 5])
    inputs = torch.tensor([5, 6, 7, 8, 3, 4, 4, 4, 7, 8, 2, 3])
    accepted, continues = accept(samples, inputs, torch.tensor([3, 3, 2]), 4)
    # Row 0: 6 and 7 agree, 9 not; row 1: 5 not 4; row 2: both agree (there is no third).
    assert accepted.tolist() == [2, 0, 2] and continues.tolist() == [9, 5, 3]


@pytest.fixture(scope="module")
def engines(tiny_checkpoint: Callable[[str], Path]) -> tuple[LLM, LLM]:
    model = str(tiny_checkpoint("llama"))
    return LLM(model, **OPTIONS), LLM(model, **OPTIONS, speculative_config=NGRAM)


PROMPTS = [[11, 12, 13, 14, 11, 12, 13, 14, 11, 12], [7, 8, 9] * 5, [21, 22, 23, 24, 25, 26]]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
        SamplingParams(
            temperature=1.0, top_k=2, seed=4, max_tokens=40, ignore_eos=True, logprobs=1
        ),
    ],
    ids=["greedy", "seeded"],
)
def test_outputs_are_those_without_speculation(
    engines: tuple[LLM, LLM], params: SamplingParams
) -> None:
    plain, fast = engines
    stats = fast.engine.scheduler.speculation
    before = (stats.num_verify_steps, stats.num_accepted_tokens)
    expected = plain.generate(PROMPTS, params, use_tqdm=False)
    outputs = fast.generate(PROMPTS, params, use_tqdm=False)
    assert [r.outputs[0].token_ids for r in outputs] == [r.outputs[0].token_ids for r in expected]
    for mine, theirs in zip(outputs, expected):
        for a, b in zip(mine.outputs[0].logprobs or [], theirs.outputs[0].logprobs or []):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
    assert stats.num_verify_steps > before[0] and stats.num_accepted_tokens > before[1]
    pool = fast.engine.pool
    assert pool.audit_blocks() == [] and pool.used_blocks() == 0


def test_verify_steps_run_ahead_and_the_history_holds_each_sequences_tokens(
    engines: tuple[LLM, LLM],
) -> None:
    """(On the CPU a queued step has run by the time ``step`` returns: its inputs are in the
    history, all but the last known token, which the next step writes.)"""
    _, fast = engines
    engine = fast.engine
    assert engine.scheduler.verify_queries == 4
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request(PROMPTS[1], params)
    ahead = checked = 0
    while engine.has_unfinished_requests():
        engine.step()
        in_flight = engine.pipeline.uncollected
        ahead += in_flight is not None and in_flight.scheduled.verify_queries > 0
        if engine.scheduler.running:
            request = engine.scheduler.running[0]
            table = engine.pool.block_table(request.seq_id)
            slots = [table[p // 4] * 4 + p % 4 for p in range(request.num_tokens - 1)]
            assert engine.runner.history.ids[slots].tolist() == request.token_ids[:-1]
            checked += 1
    assert ahead > 5 and checked > 5
