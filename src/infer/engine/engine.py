"""The engine: owns the model, the cache pool, the scheduler and the runner; one ``step()``
retires, schedules, runs one forward pass, samples, and turns tokens into text.

It is single-threaded and synchronous; the offline ``LLM`` drives it in a loop and the
server runs it in its own thread (``server/async_engine.py``).
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from infer.config import EngineConfig, ModelConfig
from infer.engine.cuda_graphs import CUDAGraphRunner
from infer.engine.memory import KVCacheBuilder
from infer.engine.output import record_token, request_output
from infer.engine.prompts import Prompt, PromptEncoder
from infer.engine.request import PENDING_TOKEN, Request, RequestOutput, TokenLogprob
from infer.engine.runner import LaunchedStep, ModelRunner
from infer.engine.sampling_params import SamplingParams
from infer.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from infer.engine.structured import StructuredOutputs
from infer.engine.warmup import warm_up_kernels
from infer.loader import ModelSource, load_model, resolve_model
from infer.tokenizer import Message, Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class Inflight:
    """A launched step whose samples the host has not processed yet."""

    scheduled: SchedulerOutput
    launched: LaunchedStep | None
    decode_only: bool

    def requests(self) -> list[Request]:
        return [c.request for c in self.scheduled.chunks]


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolved_device
        self.dtype = config.torch_dtype
        self.source: ModelSource = resolve_model(config.model)
        self.model_config = ModelConfig.from_hf_dict(self.source.hf_config)
        self.max_seq_len = config.resolved_max_seq_len(self.model_config)
        self.model, _ = load_model(
            self.source, self.device, self.dtype, self.max_seq_len, config.load_format, config.seed
        )
        self.tokenizer = self._load_tokenizer()
        self.prompts = PromptEncoder(self.tokenizer, self.model_config.vocab_size, self.max_seq_len)
        self.pool = KVCacheBuilder(
            config, self.model_config, self.model, self.device, self.dtype, self.max_seq_len
        ).build()
        graphs = None
        if config.cuda_graphs_enabled and not _torch_attention_forced():
            graphs = CUDAGraphRunner(
                self.model, config.block_size, config.max_batch_size, self.max_seq_len, self.device
            )
        self.runner = ModelRunner(self.model, self.pool, self.device, self.max_seq_len, graphs)
        if self.device.type == "cuda":
            warm_up_kernels(self.model, self.pool, self.device, self.max_seq_len)
        if graphs is not None:
            graphs.capture()
        self.scheduler = Scheduler(config, self.pool, self.max_seq_len)
        self.structured = StructuredOutputs(self.tokenizer, self.model_config.vocab_size)
        self._inflight: Inflight | None = None
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._seeds = random.Random(config.seed)
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.peak_utilization = 0.0

    # --- construction --------------------------------------------------------------------
    def _load_tokenizer(self) -> Tokenizer | None:
        path = self.config.tokenizer or self.source.tokenizer_path
        if path is None:
            return None
        return Tokenizer.load(Path(path), self.model_config.eos_token_ids)

    # --- requests ------------------------------------------------------------------------
    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return self.prompts.encode_prompt(prompt)

    def encode_chat(self, messages: list[Message]) -> list[int]:
        return self.prompts.encode_chat(messages)

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Queue one sequence (``params.n`` is expanded by the callers). Raises
        ``ValueError`` for bad input and ``QueueFullError`` when the queue is full."""
        params = params or SamplingParams()
        token_ids = self.encode_prompt(prompt)
        params.check_for_model(self.model_config.vocab_size, self.max_seq_len)
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self._requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        eos = (
            self.tokenizer.eos_token_ids
            if self.tokenizer
            else frozenset(self.model_config.eos_token_ids)
        )
        detokenizer = None
        if params.detokenize and self.tokenizer is not None:
            detokenizer = self.tokenizer.detokenizer(params.skip_special_tokens)
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        request = Request(
            request_id, list(token_ids), len(token_ids), params, seed, frozenset(eos), detokenizer
        )
        self.structured.attach(request)  # starts compiling its grammar, if it has one
        self.scheduler.add_request(request)
        self._requests[request_id] = request
        return request_id

    def abort(self, request_id: str) -> bool:
        """Stop a request; its blocks are freed at the start of the next step."""
        request = self.scheduler.abort(request_id)
        if request is None:
            return False
        self._requests.pop(request_id, None)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work() or self._inflight is not None

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # --- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the progress of every request that produced output.

        With ``use_async_scheduling``, a decode step that only continues the step in flight is
        queued on the device *before* the in-flight step's tokens are processed, so the host's
        bookkeeping overlaps the GPU's work; its outputs are then reported one call later.
        """
        inflight, self._inflight = self._inflight, None
        involved = [] if inflight is None else inflight.requests()
        outputs: list[RequestOutput] = []
        try:
            if inflight is not None:
                self._inflight = self._launch_ahead(inflight)
                if self._inflight is not None:
                    involved += self._inflight.requests()
                outputs += self._complete(inflight)
                if self._inflight is not None:
                    return self._reported(outputs)
            self.scheduler.retire()
            scheduled = self.scheduler.schedule()
            outputs += [self._output(r, [], []) for r in self.scheduler.take_failed()]
            if scheduled.chunks:
                involved += [c.request for c in scheduled.chunks]
                launched = self._launch(scheduled)
                if self.config.use_async_scheduling and launched.decode_only:
                    self._inflight = launched
                else:
                    outputs += self._complete(launched)
        except Exception as exc:  # these requests fail; the engine keeps serving the others
            logger.exception("engine step failed")
            self._inflight = None
            outputs += self._fail(involved, exc)
        return self._reported(outputs)

    def _reported(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        self.peak_utilization = max(self.peak_utilization, self.utilization())
        return outputs

    def _fail(self, requests: list[Request], exc: Exception) -> list[RequestOutput]:
        """Finish the requests of a failed step with the error; ``retire`` frees them."""
        message = f"{type(exc).__name__}: {exc}"
        failed = list({id(r): r for r in requests if not r.is_finished}.values())
        for request in failed:
            del request.token_ids[request.num_tokens - request.pending_tokens :]
            request.pending_tokens = 0
            request.finish("error", message)
        return [self._output(r, [], []) for r in failed]

    def _launch(self, scheduled: SchedulerOutput, input_ids: Tensor | None = None) -> Inflight:
        """Queue a step on the device and account for its tokens; samples stay pending."""
        decode_only = scheduled.is_decode_only
        launched = self.runner.launch(scheduled.chunks, input_ids)
        for chunk in scheduled.chunks:
            request = chunk.request
            assert request.slot is not None
            if request.num_output_tokens == 0:
                self.num_prompt_tokens += chunk.num_tokens
            request.num_computed += chunk.num_tokens
            self.pool.advance(request.slot, chunk.num_tokens)
        for request in launched.requests if launched else []:
            request.token_ids.append(PENDING_TOKEN)
            request.pending_tokens += 1
        return Inflight(scheduled, launched, decode_only)

    def _launch_ahead(self, inflight: Inflight) -> Inflight | None:
        """The next decode step of the in-flight one's requests, fed from its device tokens;
        None when the next step needs the host first (admissions, preemption, penalties,
        grammars)."""
        previous = inflight.launched
        if previous is None or not inflight.decode_only or self.scheduler.waiting:
            return None
        self.scheduler.retire()
        members = {id(r) for r in previous.requests}
        if any(id(r) not in members for r in self.scheduler.running if not r.is_finished):
            return None
        rows = [
            i
            for i, r in enumerate(previous.requests)
            if not r.is_finished and not self._ends_by_length(r)
        ]
        requests = [previous.requests[i] for i in rows]
        if not requests or any(r.params.needs_output_tokens for r in requests):
            return None
        if not all(self.pool.prepare_append(r.slot, 1) for r in requests):  # type: ignore[arg-type]
            return None
        index = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        chunks = [ScheduledChunk(r, 1) for r in requests]
        return self._launch(SchedulerOutput(chunks), previous.token_ids[index])

    def _ends_by_length(self, request: Request) -> bool:
        """Whether the request's pending token is its last one (known before it is)."""
        limit = request.params.max_tokens
        return (limit is not None and request.num_output_tokens >= limit) or (
            request.num_tokens >= self.max_seq_len
        )

    def _complete(self, inflight: Inflight) -> list[RequestOutput]:
        """Wait for a launched step's samples and turn them into tokens, text and outputs."""
        outputs = []
        launched = inflight.launched
        if launched is not None:
            result = self.runner.collect(launched)
            now = time.perf_counter()
            for request, token_id, logprob in zip(
                launched.requests, result.token_ids, result.logprobs
            ):
                if request.is_finished:  # aborted, or stopped while this step was queued
                    continue
                position = request.num_tokens - request.pending_tokens
                request.token_ids[position] = token_id
                request.pending_tokens -= 1
                if logprob is not None:
                    request.logprobs.append(logprob)
                self.num_generated_tokens += 1
                new_text = record_token(request, token_id, now, self.max_seq_len)
                if request.is_finished:  # drop a token queued after its end
                    del request.token_ids[position + 1 :]
                    request.pending_tokens = 0
                outputs.append(
                    self._output(request, [token_id], [logprob] if logprob else [], new_text)
                )
        for chunk in inflight.scheduled.chunks:
            request = chunk.request
            if request.slot is not None:
                # Pending tokens sit at or past the computed length, which is all it reads.
                self.pool.index_blocks(request.slot, request.token_ids)
        return outputs

    def _output(
        self,
        request: Request,
        new_ids: list[int],
        new_logprobs: list[TokenLogprob],
        new_text: str = "",
    ) -> RequestOutput:
        if request.is_finished:
            self._requests.pop(request.request_id, None)
        return request_output(request, new_ids, new_logprobs, new_text)

    # --- introspection ---------------------------------------------------------------------
    def utilization(self) -> float:
        return self.pool.used_blocks() / self.pool.num_blocks

    def cache_stats(self) -> dict[str, float | int | str]:
        stats = self.pool.stats()
        stats.preemptions = self.scheduler.preemptions
        return stats.as_dict()


def _torch_attention_forced() -> bool:
    return os.environ.get("INFER_DISABLE_TRITON") == "1"
