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
from infer.engine.speculative.verify_step import VerifyPlan, load_rows, new_rows, row_layout
from infer.kernels.verify_inputs import ProposalMode, RowStarts

NGRAM = {"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
OPTIONS: dict[str, Any] = {"num_gpu_blocks": 256, "max_seq_len": 256, "block_size": 4}


def _loaded(plan: VerifyPlan, previous: Any) -> tuple[RowStarts, torch.Tensor, torch.Tensor]:
    rows, extra = new_rows(len(plan.tables), torch.device("cpu"))
    tables = torch.full((4, 6), -1, dtype=torch.int32)
    load_rows(plan, previous, rows, extra, tables)
    return rows, extra, tables


def test_rows_fed_from_a_verify_step_start_past_what_it_accepted() -> None:
    samples, accepted = torch.tensor([50, 60, 70]), torch.tensor([2, 0, 3])
    plan = VerifyPlan(
        [[4, 5], [6], [7, 8, 9]], [0, 0, 0], [9, 20, 30], [3, 3, 0], [2, 0, 1], ProposalMode.NGRAM
    )
    rows, extra, tables = _loaded(plan, (samples, accepted))
    assert rows.first.tolist() == [70, 50, 60] and rows.base.tolist() == [12, 22, 30]
    assert extra.tolist() == [3, 2, 0] and rows.limit.tolist() == [3, 3, 0]
    assert rows.num_rows.tolist() == [3, 0] and rows.mode.tolist() == [0]
    assert tables[:3, :3].tolist() == [[4, 5, 0], [6, 0, 0], [7, 8, 9]]
    after_plain, extra, _ = _loaded(plan, (samples, None))
    assert after_plain.first.tolist() == [70, 50, 60] and after_plain.base.tolist() == [9, 20, 30]
    assert extra.tolist() == [0, 0, 0]


def test_rows_not_fed_start_where_the_host_says() -> None:
    plan = VerifyPlan([[1], [2]], [5, 6], [3, 4], [2, 1], None, ProposalMode.REPEAT)
    rows, extra, _ = _loaded(plan, None)
    assert rows.first.tolist() == [5, 6] and rows.base.tolist() == [3, 4]
    assert extra.tolist() == [0, 0] and rows.mode.tolist() == [2]


def test_the_layout_pads_a_bucket_with_rows_without_tokens() -> None:
    starts, order, owners = row_layout(torch.tensor([2, 0], dtype=torch.int32), 4, 3)
    assert starts.tolist() == [0, 3, 6, 6, 6] and order.tolist() == [0, 1, 2, 3]
    assert owners.tolist() == [0, 0, 0, 1, 1, 1] + [-1] * 6


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
        assert engine.ahead is not None
        in_flight = engine.ahead.in_flight
        ahead += in_flight is not None and in_flight.verify_queries > 0
        if engine.scheduler.running:
            request = engine.scheduler.running[0]
            table = engine.pool.block_table(request.seq_id)
            slots = [table[p // 4] * 4 + p % 4 for p in range(request.num_tokens - 1)]
            assert engine.runner.history.ids[slots].tolist() == request.token_ids[:-1]
            checked += 1
    assert ahead > 5 and checked > 5
