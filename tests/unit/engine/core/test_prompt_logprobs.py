"""Prompt scoring: which positions of a step are projected, and where their scores go."""

from __future__ import annotations

import torch

from infer.contract.sampling_params import SamplingParams
from infer.engine.core import prompt_logprobs
from infer.engine.core.request import Request
from infer.engine.core.step import ScheduledChunk, Step


def _request(name: str, prompt: list[int], scored: int | None) -> Request:
    return Request(name, prompt, len(prompt), SamplingParams(prompt_logprobs=scored), seed=0)


def _step(*chunks: ScheduledChunk) -> Step:
    """A step as the scheduler builds it (it flags those with a scoring request)."""
    scores = any(c.request.prompt_logprobs is not None for c in chunks)
    return Step(chunks=list(chunks), scores_prompts=scores)


def test_only_chunks_of_requests_that_ask_are_planned() -> None:
    scoring = _request("a", [10, 11, 12, 13, 14], scored=2)
    other = _request("b", [20, 21, 22], scored=None)
    rows, spans = prompt_logprobs.plan(
        _step(ScheduledChunk(other, 0, 3, True), ScheduledChunk(scoring, 0, 3, False))
    )
    # Positions 0-2 of "a" (flat 3-5) predict its tokens 1-3.
    assert (rows.positions, rows.targets, rows.num_top) == ([3, 4, 5], [11, 12, 13], 2)
    assert [(s.first, s.offset, s.count) for s in spans] == [(1, 0, 3)]
    # The last chunk's final position predicts the first output, not a prompt token.
    rows, spans = prompt_logprobs.plan(_step(ScheduledChunk(scoring, 3, 2, True)))
    assert (rows.positions, rows.targets) == ([0], [14])
    assert [(s.first, s.count) for s in spans] == [(4, 1)]
    decode = prompt_logprobs.plan(_step(ScheduledChunk(scoring, 5, 1, True)))[0]
    assert decode.positions == []


def test_scores_are_the_log_softmax_of_each_next_token() -> None:
    request = _request("a", [0, 2, 1], scored=1)
    rows, spans = prompt_logprobs.plan(_step(ScheduledChunk(request, 0, 3, True)))
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    scores = prompt_logprobs.score(rows, lambda flat: logits[flat], torch.device("cpu"))
    prompt_logprobs.record(spans, scores)
    expected = torch.log_softmax(logits, dim=-1)
    assert request.prompt_logprobs is not None and request.prompt_logprobs[0] is None
    second, third = request.prompt_logprobs[1:]
    assert second is not None and third is not None
    assert (second.token_id, second.rank, list(second.top)) == (2, 1, [2])
    assert (third.token_id, third.rank, list(third.top)) == (1, 3, [0])
    assert second.logprob == expected[0, 2].item() and third.logprob == expected[1, 1].item()
