"""The engine: owns the model, the cache pool, the scheduler and the runner; one ``step()``
retires, schedules, runs one forward pass, samples, and turns tokens into text.

It is single-threaded and synchronous; the offline ``LLM`` drives it in a loop and the
server runs it in its own thread (``server/async_engine.py``).
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infer.config import EngineConfig, ModelConfig
from infer.distributed.group import SINGLE, WorkerDiedError
from infer.engine.output import request_output
from infer.engine.prompts import Prompt, PromptEncoder
from infer.engine.rank import build_rank
from infer.engine.request import Request, RequestOutput, TokenLogprob
from infer.engine.runner import ForwardedStep, LaunchedStep
from infer.engine.sampling_params import SamplingParams
from infer.engine.scheduler import Scheduler, SchedulerOutput
from infer.engine.structured import StructuredOutputs
from infer.loader import ModelSource, resolve_model
from infer.models.common import check_tensor_parallel
from infer.tokenizer import Message, Tokenizer

if TYPE_CHECKING:
    from infer.distributed.worker import Workers

logger = logging.getLogger(__name__)


@dataclass
class Inflight:
    """A launched step whose samples the host has not collected yet."""

    scheduled: SchedulerOutput
    launched: LaunchedStep | None


@dataclass
class Ahead:
    """A step scheduled ahead of the one in flight. ``sample_later``: only its forward pass
    is queued (``forwarded``); its sampling waits for the previous step's tokens on the host."""

    scheduled: SchedulerOutput
    forwarded: ForwardedStep | None = None
    sample_later: bool = False


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolved_device
        self.dtype = config.torch_dtype
        self.source: ModelSource = resolve_model(config.model)
        self.model_config = ModelConfig.from_hf_dict(self.source.hf_config)
        self.max_seq_len = config.resolved_max_seq_len(self.model_config)
        self.workers: Workers | None = None
        group = SINGLE
        if config.tensor_parallel_size > 1:
            check_tensor_parallel(self.model_config, config.tensor_parallel_size)
            from infer.distributed.worker import start_workers  # tp=1 starts no process group

            self.workers, group = start_workers(config)
        try:
            rank = build_rank(
                config, self.source, self.model_config, self.max_seq_len, self.device, group
            )
        except Exception:
            self.close(check_workers=True)
            raise
        self.model, self.pool, self.runner = rank.model, rank.pool, rank.runner
        self.tokenizer = self._load_tokenizer()
        self.prompts = PromptEncoder(self.tokenizer, self.model_config.vocab_size, self.max_seq_len)
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
    def close(self, check_workers: bool = False) -> None:
        """Stop the tensor-parallel workers (also done at exit); ``check_workers`` first
        raises ``WorkerDiedError`` if one has died (the clearer error of a failed start)."""
        if self.workers is not None:
            workers, self.workers = self.workers, None
            runner = getattr(self, "runner", None)  # None when construction failed
            if runner is not None:
                runner.release_graphs()
            try:
                if check_workers:
                    workers.check_alive(grace_s=2.0)
            finally:
                workers.stop()

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
        """Queue one sequence (``params.n`` is expanded by the callers); ``ValueError`` for
        bad input. The queue is not bounded here: the server bounds its intake itself."""
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
        self.scheduler.add_request(request, bounded=False)
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
        """One engine step: schedule → launch → collect → update; returns the progress of
        every request that produced output.

        With ``use_async_scheduling``, the next step is scheduled and launched before this
        one's tokens are collected (its rows that sampled here take their tokens on the
        device), so the host's bookkeeping overlaps the device's work and the device never
        waits between steps; the next call collects it. When its sampling reads the output so
        far on the host (a grammar's mask, penalties), only its forward pass is queued ahead,
        and its sampling once this step's tokens are known.
        """
        outputs: list[RequestOutput] = []
        current, self._inflight = self._inflight, None
        involved = [] if current is None else current.scheduled.requests()
        try:
            if current is None:
                scheduled = self.scheduler.schedule()
                outputs += [self._output(r) for r in scheduled.failed]
                if not scheduled.chunks:
                    return outputs
                involved = scheduled.requests()
                current = self._launch(scheduled)
            ahead = self._launch_ahead(current, involved)
            if ahead is not None:
                outputs += [self._output(r) for r in ahead.scheduled.failed]
            result = self.runner.collect(current.launched)
            for new in self.scheduler.update(current.scheduled, result):
                logprobs = [] if new.logprob is None else [new.logprob]
                outputs.append(self._output(new.request, [new.token_id], logprobs, new.text))
            if ahead is not None and ahead.sample_later:  # the tokens it reads are known now
                sampled = None if ahead.forwarded is None else self.runner.sample(ahead.forwarded)
                self._inflight = Inflight(ahead.scheduled, sampled)
        except WorkerDiedError:  # no step can run any more
            raise
        except Exception as exc:  # only the request that causes it fails; the rest retry
            logger.exception("engine step failed")
            self._inflight = None
            failed = self.scheduler.recover(involved, f"{type(exc).__name__}: {exc}")
            outputs += [self._output(r) for r in failed]
        self.num_generated_tokens += sum(len(o.new_token_ids) for o in outputs)
        self.peak_utilization = max(self.peak_utilization, self.utilization())
        return outputs

    def _launch_ahead(self, current: Inflight, involved: list[Request]) -> Ahead | None:
        """With async scheduling, launch the step that follows ``current`` (it becomes the
        step in flight); where its sampling reads the output so far (a grammar's mask,
        penalties), queue only its forward pass, to sample later. Its requests join
        ``involved`` (the requests a failure of this step concerns)."""
        if not self.config.use_async_scheduling:
            return None
        scheduled = self.scheduler.schedule_ahead(current.scheduled)
        if scheduled is None:
            return None
        involved += scheduled.requests()
        if not scheduled.chunks:  # only admissions that failed
            return Ahead(scheduled)
        if any(r.params.needs_output_tokens for r in scheduled.requests()):
            self._count_prompt_tokens(scheduled)
            forwarded = self.runner.forward(scheduled, current.launched)
            return Ahead(scheduled, forwarded, sample_later=True)
        self._inflight = self._launch(scheduled, current.launched)
        return Ahead(scheduled)

    def _launch(self, scheduled: SchedulerOutput, previous: LaunchedStep | None = None) -> Inflight:
        """Queue a step on the device; its samples stay there until collected."""
        self._count_prompt_tokens(scheduled)
        return Inflight(scheduled, self.runner.launch(scheduled, previous))

    def _count_prompt_tokens(self, scheduled: SchedulerOutput) -> None:
        for chunk in scheduled.chunks:
            if chunk.request.num_output_tokens == 0:
                self.num_prompt_tokens += chunk.num_tokens

    def _output(
        self,
        request: Request,
        new_ids: list[int] | None = None,
        new_logprobs: list[TokenLogprob] | None = None,
        new_text: str = "",
    ) -> RequestOutput:
        if request.is_finished:
            self._requests.pop(request.request_id, None)
        return request_output(request, new_ids or [], new_logprobs or [], new_text)

    # --- introspection ---------------------------------------------------------------------
    def utilization(self) -> float:
        return self.pool.used_blocks() / self.pool.num_blocks

    def cache_stats(self) -> dict[str, float | int | str]:
        return {**self.pool.stats().as_dict(), "preemptions": self.scheduler.preemptions}
