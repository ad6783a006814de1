"""Scoring prompts in the prefill's own forward pass (``SamplingParams.prompt_logprobs``).

The logits at prompt position ``p`` give the logprob of prompt token ``p + 1``. A step that
holds a chunk of a request that scores its prompt projects the hidden states of that chunk's
positions through the LM head too (the other requests' positions are not projected: only
those that ask pay), takes each next token's logprob, rank and top alternatives on the
device, and writes them into the request by position, so a chunked prefill fills them chunk
by chunk and a recomputed one (after preemption) writes the same values again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from infer.contract.outputs import TokenLogprob
from infer.engine.core.request import Request
from infer.engine.core.step import Step

# Rows projected at once: bounds the [rows, vocab] float32 logits of a long prompt (512 rows
# of a 128k vocabulary: 256 MB) without a loop per row.
ROWS_PER_SLICE = 512


@dataclass
class ScoredRows:
    """Which tokens of a step's flat batch are scored: ``positions`` (flat indexes whose
    logits are read), the prompt token each predicts, and the most alternatives asked for.
    Every tensor-parallel rank gets them, since the LM head's gather is a collective."""

    positions: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    num_top: int = 0


@dataclass
class PromptScores:
    """The scores of a step's ``ScoredRows``, on the device."""

    logprobs: Tensor  # [R] the target's logprob
    ranks: Tensor  # [R] 1 + how many tokens are more likely than the target
    top_ids: Tensor  # [R, num_top]
    top_logprobs: Tensor  # [R, num_top]


@dataclass
class ScoredSpan:
    """A request's scored positions in a step: its prompt tokens ``first``, ``first + 1``,
    ... take ``count`` consecutive scores from ``offset``."""

    request: Request
    first: int
    offset: int
    count: int


def plan(step: Step) -> tuple[ScoredRows, list[ScoredSpan]]:
    """The rows of a step's chunks that score their prompt, and whose scores they are
    (none, at once, for a step without such a request)."""
    rows, spans = ScoredRows(), list[ScoredSpan]()
    if not step.scores_prompts:
        return rows, spans
    flat = 0
    for chunk in step.chunks:
        request = chunk.request
        # Positions p in the chunk whose next token p + 1 is still in the prompt.
        end = min(chunk.start + chunk.num_tokens, request.num_prompt_tokens - 1)
        if request.prompt_logprobs is not None and end > chunk.start:
            count = end - chunk.start
            spans.append(ScoredSpan(request, chunk.start + 1, len(rows.positions), count))
            rows.positions += range(flat, flat + count)
            rows.targets += request.token_ids[chunk.start + 1 : end + 1]
            rows.num_top = max(rows.num_top, request.params.prompt_logprobs or 0)
        flat += chunk.num_tokens
    return rows, spans


def score(
    rows: ScoredRows, logits_of: Callable[[Tensor], Tensor], device: torch.device
) -> PromptScores:
    """Score ``rows``; ``logits_of(flat_indexes)`` gives their logits (in the model's dtype:
    widened here, as the sampler's logprobs are)."""
    positions = torch.tensor(rows.positions, dtype=torch.int64).to(device, non_blocking=True)
    targets = torch.tensor(rows.targets, dtype=torch.int64).to(device, non_blocking=True)
    parts = []
    for start in range(0, len(rows.positions), ROWS_PER_SLICE):
        logits = logits_of(positions[start : start + ROWS_PER_SLICE])
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        target = targets[start : start + ROWS_PER_SLICE, None]
        chosen = logprobs.gather(1, target)
        ranks = (logprobs > chosen).sum(dim=-1) + 1
        top = logprobs.topk(rows.num_top, dim=-1)
        parts.append((chosen[:, 0], ranks, top.indices, top.values))
    chosen, ranks, top_ids, top_values = (torch.cat(column) for column in zip(*parts, strict=True))
    return PromptScores(chosen, ranks, top_ids, top_values)


def record(spans: list[ScoredSpan], scores: PromptScores) -> None:
    """Write the scores into their requests (one copy to the host)."""
    logprobs = scores.logprobs.tolist()
    ranks = scores.ranks.tolist()
    top_ids = scores.top_ids.tolist()
    top_values = scores.top_logprobs.tolist()
    for span in spans:
        wanted = span.request.params.prompt_logprobs or 0
        scored = span.request.prompt_logprobs
        assert scored is not None
        prompt = span.request.token_ids
        for i in range(span.offset, span.offset + span.count):
            position = span.first + i - span.offset
            top = dict(zip(top_ids[i][:wanted], top_values[i][:wanted], strict=True))
            scored[position] = TokenLogprob(prompt[position], logprobs[i], top, ranks[i])
