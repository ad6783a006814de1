"""Offline API: ``LLM(model=..., **engine options).generate(prompts, params)``, like vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from tqdm import tqdm

from infer.config import EngineConfig
from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.contract.prompts import Prompt
from infer.contract.sampling_params import SamplingParams
from infer.engine.core.engine import Engine
from infer.engine.loop import UpFront, drive
from infer.heap import frozen_heap
from infer.loader.presets import DEFAULT_MODEL
from infer.tokenizer import Message


@dataclass
class Completion:
    """One generated sequence (a prompt has ``n`` of them)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    ttft_s: float | None = None  # arrival → first token
    token_times_s: list[float] = field(default_factory=list)  # arrival → each token
    error: str | None = None


@dataclass
class GenerationResult:
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[Completion]
    # Each prompt token's logprob (None for the first), with ``SamplingParams.prompt_logprobs``
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def text(self) -> str:
        return self.outputs[0].text


class LLM:
    """Loads a model once and generates for batches of prompts or conversations."""

    def __init__(self, model: str = DEFAULT_MODEL, **engine_options: Any) -> None:
        unknown = set(engine_options) - set(EngineConfig.field_names())
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]}: not an EngineConfig option")
        self.config = EngineConfig(model=model, **engine_options)
        self.engine = Engine(self.config)

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[GenerationResult]:
        """Generate for each prompt (a string or a list of token ids)."""
        batch = cast(list[Prompt], [prompts] if _is_single_prompt(prompts) else list(prompts))
        encoded = [self.engine.encode_prompt(p) for p in batch]
        texts = [p if isinstance(p, str) else None for p in batch]
        return self._run(encoded, texts, sampling_params, use_tqdm)

    def chat(
        self,
        conversations: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[GenerationResult]:
        """Generate the assistant's reply to each conversation (chat template applied)."""
        single = bool(conversations) and isinstance(conversations[0], dict)
        batch = cast(list[list[Message]], [conversations] if single else conversations)
        encoded = [self.engine.encode_chat(messages) for messages in batch]
        return self._run(encoded, [None] * len(encoded), sampling_params, use_tqdm)

    def cache_stats(self) -> dict[str, float | int | str]:
        """Pool utilisation, fragmentation, allocation rates, preemptions, evictions, leaks."""
        return self.engine.cache_stats()

    @frozen_heap()  # no full collection scans the model's heap while it runs
    def _run(
        self,
        prompts: list[list[int]],
        texts: list[str | None],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
    ) -> list[GenerationResult]:
        params = _per_prompt(sampling_params, len(prompts))
        added: list[str] = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                for j in range(p.n):
                    child = p if p.n == 1 else p.nth_sample(j)
                    added.append(self.engine.add_request(prompt, child, request_id=f"{i}:{j}"))
        except ValueError:  # a bad prompt fails the call before anything runs
            for request_id in added:
                self.engine.abort(request_id)
            raise
        total = sum(p.n for p in params)
        with tqdm(total=total, desc="Generating", unit="seq", disable=not use_tqdm) as bar:
            batch = _Batch(self.engine, bar)
            drive(self.engine, batch)
        finished = batch.finished
        return [
            GenerationResult(
                texts[i],
                prompts[i],
                [_completion(j, finished[f"{i}:{j}"]) for j in range(params[i].n)],
                finished[f"{i}:0"].prompt_logprobs,
            )
            for i in range(len(prompts))
        ]


class _Batch(UpFront[RequestOutput]):
    """Collects the finished sequences of a batch."""

    def __init__(self, engine: Engine, bar: tqdm) -> None:
        super().__init__(engine, engine.wakeup)
        self.bar = bar
        self.finished: dict[str, RequestOutput] = {}

    def put_out(self, outputs: Sequence[RequestOutput]) -> None:
        for out in outputs:
            if out.finished:
                self.finished[out.request_id] = out
                self.bar.update(1)


def _is_single_prompt(prompts: object) -> bool:
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, Sequence) and bool(prompts) and isinstance(prompts[0], int)


def _per_prompt(
    params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    if len(params) != count:
        raise ValueError(f"sampling_params: {len(params)} given for {count} prompts")
    return list(params)


def _completion(index: int, out: RequestOutput) -> Completion:
    return Completion(
        index,
        out.text,
        out.token_ids,
        out.finish_reason,
        out.logprobs,
        out.ttft_s,
        out.token_times_s,
        out.error,
    )
