"""A request's life inside the engine (what the engine reports about it is
``contract/outputs.py``)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infer.contract.outputs import TokenLogprob
from infer.contract.sampling_params import SamplingParams
from infer.tokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from infer.engine.structured.grammar_cache import RequestGrammar


class RequestState(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted and waiting to be recomputed)
    RUNNING = "running"  # holds cache; prefilling (possibly chunk by chunk) or decoding
    FINISHED = "finished"  # stopped, hit its length, was aborted, or failed


@dataclass
class Request:
    request_id: str
    token_ids: list[int]  # the prompt, then every generated token
    num_prompt_tokens: int
    params: SamplingParams
    seed: int  # the sampling stream: params.seed, or one drawn at arrival
    eos_token_ids: frozenset[int] = frozenset()
    detokenizer: IncrementalDetokenizer | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    state: RequestState = RequestState.WAITING
    logprobs: list[TokenLogprob] = field(default_factory=list)
    seq_id: int | None = None  # its sequence in the cache pool, while it holds cache
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at its admission
    num_placeholders: int = 0  # sampled tokens still on the device, not yet in token_ids
    block_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of full blocks
    num_failed_steps: int = 0  # engine steps it was part of that raised
    suspect: bool = False  # was in a failed step: runs alone until it samples again
    text: str = ""
    emitted_text_len: int = 0  # characters already streamed to the caller
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    grammar: RequestGrammar | None = None  # its structured-outputs matcher, if constrained
    # Each prompt token's score once the prefill has computed it (``params.prompt_logprobs``;
    # the first token has none), by position: a recomputed prefill writes the same ones.
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def __post_init__(self) -> None:
        params = self.params
        # Decided once here, read every step: which tokens stop it, and whether an argmax
        # (within its grammar's mask, if it has one) is all its sampling needs.
        eos = frozenset() if params.ignore_eos else self.eos_token_ids
        self.stop_token_ids: frozenset[int] = frozenset(params.stop_token_ids) | eos
        if params.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * self.num_prompt_tokens
        self.greedy_argmax = (
            params.greedy
            and not params.needs_penalties
            and params.logprobs is None
            and params.min_tokens == 0
            and not params.logit_bias
        )

    @property
    def num_tokens(self) -> int:
        """Known tokens: the prompt and the outputs the host has seen."""
        return len(self.token_ids)

    @property
    def num_tokens_with_pending(self) -> int:
        """Known tokens plus the sampled ones still on the device: what the next step extends."""
        return len(self.token_ids) + self.num_placeholders

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    def reaches_length(self, num_tokens: int, max_seq_len: int) -> bool:
        """Whether ``num_tokens`` in all are as many as ``max_tokens`` or the context allow."""
        limit = self.params.max_tokens
        return (
            limit is not None and num_tokens - self.num_prompt_tokens >= limit
        ) or num_tokens >= max_seq_len

    def finish(self, reason: str, error: str | None = None) -> None:
        self.state = RequestState.FINISHED
        self.finish_reason = reason
        self.error = error
