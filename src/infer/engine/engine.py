"""The engine: owns the model, the cache pool, the scheduler and the runner; one ``step()``
retires, schedules, runs one forward pass, samples, and turns tokens into text.

It is single-threaded and synchronous; the offline ``LLM`` drives it in a loop and the
server runs it in a process of its own (``server/engine_process.py``).
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
from infer.engine.bitmask import Bitmask, start_bitmask
from infer.engine.draft_proposer import DraftModelProposer
from infer.engine.grammar_cache import StructuredOutputs
from infer.engine.output import request_output
from infer.engine.pacing import LaunchPacer, StepShape
from infer.engine.prompts import Prompt, PromptEncoder
from infer.engine.rank import build_rank
from infer.engine.request import Request, RequestOutput, TokenLogprob
from infer.engine.runner import ForwardedStep, LaunchedStep
from infer.engine.sampling_params import SamplingParams
from infer.engine.scheduler import Scheduler, SchedulerOutput, StepResult
from infer.engine.speculation import NgramProposer, Proposer
from infer.engine.wakeup import Wakeup
from infer.engine.watch import EngineView, EngineWatch, mean_itl
from infer.loader import ModelSource, resolve_model
from infer.models.common import check_tensor_parallel
from infer.tokenizer import Message, Tokenizer

if TYPE_CHECKING:
    from infer.engine.tp_worker import Workers

logger = logging.getLogger(__name__)


@dataclass
class UncollectedStep:
    """A launched step whose samples the host has not collected yet."""

    scheduled: SchedulerOutput
    launched: LaunchedStep | None


@dataclass
class Deferred:
    """A step queued behind the one in flight whose sampling reads that step's tokens (a
    grammar's mask, penalties): its forward pass is queued, its sampling waits for them."""

    scheduled: SchedulerOutput
    forwarded: ForwardedStep | None


def _shape(scheduled: SchedulerOutput) -> StepShape:
    return scheduled.num_tokens, len(scheduled.chunks)


def _reads_outputs(scheduled: SchedulerOutput) -> bool:
    """Whether a step's sampling reads its requests' outputs so far on the host (a
    grammar's mask, penalties), so it must wait for the step before it."""
    return any(r.params.needs_output_tokens for r in scheduled.requests())


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolved_device
        self.dtype = config.torch_dtype
        self.source: ModelSource = resolve_model(config.model)
        self.model_config = ModelConfig.from_hf_dict(self.source.hf_config)
        self.workers: Workers | None = None
        group = SINGLE
        if config.tensor_parallel_size > 1:
            check_tensor_parallel(self.model_config, config.tensor_parallel_size)
            from infer.engine.tp_worker import start_workers  # tp=1 starts no process group

            self.workers, group = start_workers(config)
        self.draft: DraftModelProposer | None = None
        try:
            context = config.resolved_max_seq_len(self.model_config)
            spec = config.speculative_config
            if spec is not None and spec.model is not None:  # first: the target takes the rest
                self.draft = DraftModelProposer.build(config, context, self.device)
            rank = build_rank(config, self.source, self.model_config, context, self.device, group)
        except Exception:
            self.close(check_workers=True)
            raise
        self.model, self.pool, self.runner = rank.model, rank.pool, rank.runner
        self.max_seq_len = rank.max_seq_len
        self.tokenizer = self._load_tokenizer()
        self.prompts = PromptEncoder(self.tokenizer, self.model_config.vocab_size, self.max_seq_len)
        self.scheduler = Scheduler(config, self.pool, self.max_seq_len, self._proposer())
        self.structured = StructuredOutputs(self.tokenizer, self.model_config.vocab_size)
        self.pacer = (
            LaunchPacer() if config.use_launch_pacing and config.use_async_scheduling else None
        )
        self._uncollected: UncollectedStep | None = None
        self._deferred: Deferred | None = None
        # The last step found nothing it could run (only requests whose grammars compile):
        # loops then block on ``wakeup`` (set when one has compiled) and their inputs.
        self.stalled = False
        self.wakeup = Wakeup()
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._seeds = random.Random(config.seed)
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_structured_output_errors = 0  # grammars' matchers that failed
        self.peak_utilization = 0.0
        self.watch = EngineWatch()  # the dashboard's view (records only while watched)

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

    def _proposer(self) -> Proposer | None:
        spec = self.config.speculative_config
        if spec is None:
            return None
        return self.draft if self.draft is not None else NgramProposer(spec)

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
        if request.grammar is not None:
            request.grammar.when_ready(self.wakeup.set)
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
        return (
            self.scheduler.has_work() or self._uncollected is not None or self._deferred is not None
        )

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # --- the step ------------------------------------------------------------------------
    def wait_to_schedule(self) -> None:
        """For loops that take in new requests between steps: sleep until the step in flight
        is about to end (``LaunchPacer``), then take them in and call ``step``, so that they
        join the step queued next. Returns at once when there is nothing to pace."""
        if self.pacer is not None and self._uncollected is not None and self._deferred is None:
            self.pacer.wait(_shape(self._uncollected.scheduled))

    def step(self) -> list[RequestOutput]:
        """One engine step (``_step``), recorded for the dashboard while one watches."""
        watch = self.watch
        if not watch.armed:
            return self._step()
        watch.begin()
        outputs = self._step()
        watch.stepped()
        for out in outputs:
            if out.finished and out.ttft_s is not None:
                watch.finished(out.ttft_s, mean_itl(out.token_times_s))
        return outputs

    def _step(self) -> list[RequestOutput]:
        """One engine step: schedule → launch → collect → update; returns the progress of
        every request that produced output.

        With ``use_async_scheduling``, the next step is scheduled and launched before this
        one's tokens are collected (its rows that sampled here take their tokens on the
        device), so the host's bookkeeping overlaps the device's work and the device never
        waits between steps; the next call collects it. When its sampling reads the output so
        far on the host (a grammar's mask, penalties), only its forward pass is queued ahead
        (``Deferred``); once this step's tokens are collected, llguidance fills its masks
        while the host records the tokens and schedules the step after it, then it is
        sampled and the step after it queued behind.
        """
        outputs: list[RequestOutput] = []
        self.stalled = False
        current, self._uncollected = self._uncollected, None
        deferred, self._deferred = self._deferred, None
        involved = [] if current is None else current.scheduled.requests()
        if deferred is not None:
            involved += deferred.scheduled.requests()
        try:
            if current is None:
                scheduled = self.scheduler.schedule()
                outputs += [self._output(r) for r in scheduled.failed]
                if not scheduled.chunks:
                    self.stalled = self.scheduler.has_work()
                    return outputs
                involved = scheduled.requests()
                current = self._launch(scheduled)
            if deferred is None:
                deferred = self._launch_ahead(current, involved, outputs)
            result = self._collect(current)
            bitmask = None if deferred is None else self._start_bitmask(deferred, current, result)
            outputs += self._end_failed_grammars()
            for new in self.scheduler.update(current.scheduled, result):
                outputs.append(self._output(new.request, new.token_ids, new.logprobs, new.text))
            if deferred is not None:  # the tokens its sampling reads are known now
                self._sample_deferred(deferred, bitmask, involved, outputs)
        except WorkerDiedError:  # no step can run any more
            raise
        except Exception as exc:  # only the request that causes it fails; the rest retry
            if self.workers is not None:  # unless a collective failed because a worker died
                self.workers.check_alive(grace_s=1.0)  # (its exit may lag its sockets')
            logger.exception("engine step failed")
            self._uncollected = self._deferred = None
            failed = self.scheduler.recover(involved, f"{type(exc).__name__}: {exc}")
            outputs += [self._output(r) for r in failed]
        self.num_generated_tokens += sum(len(o.new_token_ids) for o in outputs)
        self.peak_utilization = max(self.peak_utilization, self.utilization())
        return outputs

    def _launch_ahead(
        self, current: UncollectedStep, involved: list[Request], outputs: list[RequestOutput]
    ) -> Deferred | None:
        """With async scheduling, launch the step that follows ``current`` (it becomes the
        step in flight), or only its forward pass when its sampling reads the output so far
        (returned, to be sampled once ``current``'s tokens are known). Its requests join
        ``involved`` (those a failure of this step concerns)."""
        if not self.config.use_async_scheduling:
            return None
        scheduled = self._schedule_after(current.scheduled, involved, outputs)
        if scheduled is None:
            return None
        if _reads_outputs(scheduled):
            return self._defer(scheduled, current.launched)
        self._uncollected = self._launch(scheduled, current.launched)
        return None

    def _collect(self, current: UncollectedStep) -> StepResult:
        """Wait for the step's samples; a pacer also learns when the next step was queued
        and whether this one was still running then."""
        if self.pacer is None:
            return self.runner.collect(current.launched)
        self.pacer.launched()
        waited = not self.runner.is_done(current.launched)
        result = self.runner.collect(current.launched)
        queued_behind = self._uncollected is not None
        self.pacer.collected(_shape(current.scheduled), waited, queued_behind)
        return result

    def _sample_deferred(
        self,
        deferred: Deferred,
        bitmask: Bitmask | None,
        involved: list[Request],
        outputs: list[RequestOutput],
    ) -> None:
        """Sample the deferred step (it becomes the step in flight). While constrained or
        penalised rows go on, the step after it is scheduled first, as its masks fill, and
        its forward pass queued behind the sampling: deferred in turn."""
        after = None
        if self.config.use_async_scheduling and _reads_outputs(deferred.scheduled):
            after = self._schedule_after(deferred.scheduled, involved, outputs)
        sampled = None
        if deferred.forwarded is not None:
            sampled = self.runner.sample(deferred.forwarded, bitmask)
        self._uncollected = UncollectedStep(deferred.scheduled, sampled)
        if after is not None:
            self._deferred = self._defer(after, sampled)

    def _schedule_after(
        self, previous: SchedulerOutput, involved: list[Request], outputs: list[RequestOutput]
    ) -> SchedulerOutput | None:
        """The step after ``previous`` (in flight), None when there is none to run ahead;
        admissions that failed are reported in ``outputs``."""
        scheduled = self.scheduler.schedule_ahead(previous)
        if scheduled is None:
            return None
        involved += scheduled.requests()
        outputs += [self._output(r) for r in scheduled.failed]
        return scheduled if scheduled.chunks else None

    def _defer(self, scheduled: SchedulerOutput, previous: LaunchedStep | None) -> Deferred:
        """Queue only the step's forward pass (behind ``previous``)."""
        self._count_prompt_tokens(scheduled)
        deferred = Deferred(scheduled, self.runner.forward(scheduled, previous))
        self._watch_launch(scheduled)
        return deferred

    def _start_bitmask(
        self, deferred: Deferred, current: UncollectedStep, result: StepResult
    ) -> Bitmask | None:
        """Start filling the deferred step's grammar masks, from the tokens just collected
        (the matchers consume them before ``update`` records them)."""
        if deferred.forwarded is None:
            return None
        sampled = current.scheduled.chunks_that_sample()
        pending = {
            c.request.request_id: token
            for c, token in zip(sampled, result.token_ids)
            if c.request.grammar is not None
        }
        requests = deferred.forwarded.requests
        return start_bitmask(requests, self.runner.vocab_size, self.device, pending)

    def _end_failed_grammars(self) -> list[RequestOutput]:
        """End the requests whose matcher failed in a fill done by now (every fill of a step
        sampled so far) with its error, before ``update`` records their next token: it was
        drawn from a mask that gave only the end of sequence."""
        ended = []
        for request in self.structured.take_failed():
            self.num_structured_output_errors += 1
            if not request.is_finished:
                assert request.grammar is not None
                request.finish("error", request.grammar.failure)
                ended.append(self._output(request))
        return ended

    def _launch(
        self, scheduled: SchedulerOutput, previous: LaunchedStep | None = None
    ) -> UncollectedStep:
        """Queue a step on the device; its samples stay there until collected."""
        self._count_prompt_tokens(scheduled)
        uncollected = UncollectedStep(scheduled, self.runner.launch(scheduled, previous))
        self._watch_launch(scheduled)
        return uncollected

    def _watch_launch(self, scheduled: SchedulerOutput) -> None:
        if self.watch.recording:
            self.watch.launched(scheduled, self.runner.graphed)

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

    def dashboard_view(self) -> EngineView:
        """A picture of the pool and queues for the dashboard (between steps); keeps the
        steps recorded while it is asked for."""
        return self.watch.view(self.scheduler)
