"""The engine: owns the model, the cache pool, the scheduler and the runner; one ``step()``
schedules a ``Step``, launches its forward pass, samples, collects the samples and updates
the requests with them (tokens, text, stop rules). With async scheduling the next step is
queued before this one is collected (``RunAhead``).

It is single-threaded and synchronous; the offline ``LLM`` drives it in a loop and the
server runs it in a process of its own (``engine/process.py``).
"""

from __future__ import annotations

import itertools
import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING

from infer.cache.protocol import CachePoolProtocol
from infer.config import EngineConfig, ModelConfig
from infer.contract.engine_view import EngineView
from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.contract.prompts import Prompt, PromptEncoder
from infer.contract.sampling_params import SamplingParams
from infer.distributed.group import SINGLE, WorkerDiedError
from infer.engine.core.output import request_output
from infer.engine.core.pacing import LaunchPacer
from infer.engine.core.request import Request
from infer.engine.core.run_ahead import RunAhead
from infer.engine.core.scheduler import Scheduler
from infer.engine.core.step import Step
from infer.engine.core.wakeup import Wakeup
from infer.engine.core.watch import EngineWatch, mean_itl
from infer.engine.setup.memory import kv_bytes_per_token
from infer.engine.setup.rank import build_rank
from infer.engine.setup.rehearsal import WARM_UP, RehearsedPart, emptied, rehearse
from infer.engine.setup.start_up_log import start_up_part
from infer.engine.speculative.draft_proposer import DraftModelProposer
from infer.engine.speculative.speculation import NgramProposer, Proposer, VerifyCosts
from infer.engine.speculative.verify_step import MAX_VERIFY_TOKENS
from infer.engine.structured.grammar_cache import StructuredOutputs
from infer.kernels.jit_cache import use_kernel_cache
from infer.kernels.jit_log import JIT_LOG
from infer.loader import ModelSource, resolve_model
from infer.models.common import check_tensor_parallel
from infer.tokenizer import Message, Tokenizer

if TYPE_CHECKING:
    from infer.engine.setup.tp_worker import Workers

logger = logging.getLogger(__name__)


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
            from infer.engine.setup.tp_worker import start_workers

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
        self.model, self.runner = rank.model, rank.runner
        self.max_seq_len = rank.max_seq_len
        with start_up_part("load the tokenizer"):
            self.tokenizer = self._load_tokenizer()
        self.prompts = PromptEncoder(self.tokenizer, self.model_config.vocab_size, self.max_seq_len)
        self.structured = StructuredOutputs(self.tokenizer, self.model_config.vocab_size)
        self.wakeup = Wakeup()
        # What it learns of the device's step times holds after the warm-up too.
        pacing = config.use_launch_pacing and config.use_async_scheduling
        self.pacer = LaunchPacer() if pacing else None
        self._start_serving(rank.pool)
        # What the warm-up ran, each part with its time (empty without one).
        self.warm_up: list[RehearsedPart] = []
        if config.warm_up_enabled:
            try:
                with start_up_part(f"{WARM_UP}: all parts"):
                    self.warm_up = rehearse(self)
            except Exception:
                self.close()
                raise
            self._start_serving(emptied(self.pool))
            JIT_LOG.mark_ready()  # a kernel variant built from now on is a warning
        built = JIT_LOG.variants
        if built:
            logger.info(
                "start-up: %d kernel variants built (%.1f s compiling); kernel cache: %s",
                len(built), sum(v.seconds for v in built if not v.from_cache), use_kernel_cache(),
            )  # fmt: skip

    def _start_serving(self, pool: CachePoolProtocol) -> None:
        """The host-side state of serving, on ``pool`` (empty): the queues, the steps queued
        ahead, the counters. Set again after the warm-up, so nothing of it stays but the
        pacer's step times."""
        config = self.config
        self.pool = self.runner.pool = pool
        self.scheduler = Scheduler(config, pool, self.max_seq_len, self._proposer())
        if self.runner.verify is not None and self.draft is None:
            graphs, queries = self.runner.graphs, self.runner.verify.queries
            measured = None if graphs is None else graphs.verify_costs
            # On a GPU a wide batch is compute-bound; on the CPU (tests) any batch speculates.
            widest = MAX_VERIFY_TOKENS // queries if self.device.type == "cuda" else None
            self.scheduler.use_device_proposals(queries, VerifyCosts(measured, max_rows=widest))
        self.ahead: RunAhead | None = None  # async scheduling's steps queued ahead
        if config.use_async_scheduling:
            self.ahead = RunAhead(
                self.runner, self.pacer, schedule_after=self._schedule, launch=self._launch
            )
        self._scheduled: list[Step] = []  # the steps the engine step under way scheduled
        # The last step found nothing it could run (only requests whose grammars compile):
        # loops then block on ``wakeup`` (set when one has compiled) and their inputs.
        self.stalled = False
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
        return self.scheduler.has_work() or (self.ahead is not None and self.ahead.busy)

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
        if self.ahead is not None:
            self.ahead.wait_to_schedule()

    def step(self) -> list[RequestOutput]:
        """One engine step; returns the progress of every request that produced output.
        Recorded for the dashboard while one watches."""
        watch = self.watch
        if not watch.armed:
            return self._step_or_recover()
        watch.begin()
        outputs = self._step_or_recover()
        watch.stepped()
        for out in outputs:
            if out.finished and out.ttft_s is not None:
                watch.finished(out.ttft_s, mean_itl(out.token_times_s))
        return outputs

    def _step(self, outputs: list[RequestOutput]) -> None:
        """One step: schedule → launch → sample → collect → update; ``outputs`` takes the
        progress of every request that produced output."""
        step = self._schedule()
        if step is None:
            return
        self._launch(step)
        self.runner.sample(step)
        self.runner.collect(step)
        self._update(step, outputs)

    def _step_ahead(self, outputs: list[RequestOutput]) -> None:
        """One step with async scheduling (``RunAhead``): the step in flight, queued by the
        last call, is collected once the next is queued behind it, so the device runs that
        one while the host updates the requests with this one's tokens."""
        ahead = self.ahead
        assert ahead is not None
        step = ahead.take()
        if step is None:  # nothing in flight: schedule, launch and sample one now
            step = self._schedule()
            if step is None:
                return
            self._launch(step)
            self.runner.sample(step)
        ahead.queue_next(step)
        ahead.collect(step)
        self._update(step, outputs)
        ahead.sample_deferred()

    def _step_or_recover(self) -> list[RequestOutput]:
        """``_step`` (``_step_ahead`` with async scheduling), and the admissions that failed
        while it scheduled. When it raises, only the request that causes it fails
        (``Scheduler.recover``): the others of its steps are recomputed."""
        self.stalled = False
        ahead = self.ahead
        queued = [] if ahead is None else ahead.queued()
        outputs: list[RequestOutput] = []
        try:
            if ahead is None:
                self._step(outputs)
            else:
                self._step_ahead(outputs)
        except WorkerDiedError:  # no step can run any more
            raise
        except Exception as exc:
            if self.workers is not None:  # unless a collective failed because a worker died
                self.workers.check_alive(grace_s=1.0)  # (its exit may lag its sockets')
            logger.exception("engine step failed")
            if ahead is not None:
                ahead.clear()
            involved = [r for step in queued + self._scheduled for r in step.requests()]
            error = f"{type(exc).__name__}: {exc}"
            outputs += self._outputs(self.scheduler.recover(involved, error))
        for step in self._scheduled:
            outputs += self._outputs(step.failed)
        self._scheduled.clear()
        self.num_generated_tokens += sum(len(o.new_token_ids) for o in outputs)
        self.peak_utilization = max(self.peak_utilization, self.utilization())
        return outputs

    def _schedule(self, after: Step | None = None) -> Step | None:
        """The next step (after ``after``, in flight: ``Scheduler.schedule_ahead``); None
        when it has nothing to run. Each is recorded for ``_step_or_recover``."""
        scheduler = self.scheduler
        step = scheduler.schedule() if after is None else scheduler.schedule_ahead(after)
        if step is None:
            return None
        self._scheduled.append(step)
        if step.chunks:
            return step
        if after is None:  # nothing in flight either: loops wait for new input
            self.stalled = scheduler.has_work()
        return None

    def _launch(self, step: Step, previous: Step | None = None) -> None:
        """Queue the step's forward pass (behind ``previous``, whose samples it may read on
        the device); count its prompt tokens, and show it to a watcher."""
        self.runner.launch(step, previous)
        for chunk in step.chunks:
            if chunk.request.num_output_tokens == 0:
                self.num_prompt_tokens += chunk.num_tokens
        if self.watch.recording:
            self.watch.launched(step, self.runner.graphed)

    def _update(self, step: Step, outputs: list[RequestOutput]) -> None:
        """Record the collected step's tokens (``Scheduler.update``), after ending the
        requests whose grammars failed."""
        outputs += self._end_failed_grammars()
        for new in self.scheduler.update(step):
            outputs.append(self._output(new.request, new.token_ids, new.logprobs, new.text))

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

    def _outputs(self, requests: list[Request]) -> list[RequestOutput]:
        return [self._output(r) for r in requests]

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
        """The pool's ``CacheStats``, preemptions, and its bytes: the cache's element type,
        a token's K and V over all layers (and ranks), the pool's and the used blocks'."""
        stats = self.pool.stats()
        token_bytes = kv_bytes_per_token(self.config, self.model_config, self.dtype)
        block_bytes = token_bytes * stats.block_size
        return {
            **stats.as_dict(),
            "preemptions": self.scheduler.preemptions,
            "kv_cache_dtype": str(self.config.kv_cache_torch_dtype(self.dtype)).removeprefix(
                "torch."
            ),
            "kv_bytes_per_token": token_bytes,
            "kv_cache_bytes": block_bytes * stats.num_blocks,
            "kv_used_bytes": block_bytes * stats.used_blocks,
        }

    def dashboard_view(self) -> EngineView:
        """A picture of the pool and queues for the dashboard (between steps); keeps the
        steps recorded while it is asked for."""
        return self.watch.view(self.scheduler)
