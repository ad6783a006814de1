"""What the engine reports about a request after each step: its new tokens and text, with
their log-probabilities, and the totals once it has finished."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    """Log-probability of a generated token and of the most likely alternatives."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)
    rank: int | None = None  # the token's place in the vocabulary by logprob (prompt tokens)


@dataclass(slots=True)
class RequestOutput:
    """A request's progress after a step: the new tokens and text; the totals (``token_ids``,
    ``text``, ``logprobs``, timings) once it has finished."""

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    new_text: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # all of them, when finished
    prompt_logprobs: list[TokenLogprob | None] | None = None  # when asked for and finished
    ttft_s: float | None = None  # arrival → first token
    token_times_s: list[float] = field(default_factory=list)  # arrival → each token
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
