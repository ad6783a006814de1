"""The API process's side of the engine: submit work, read each request's outputs.

The engine runs in its own process (``engine/process.py``), reached through a pair of pipes
and two threads (``replica.py``). Requests added or aborted during one turn of the event
loop go to the engine as one message. The HTTP side never waits for the engine to accept
work: it decides backpressure from its own count of unfinished sequences, then only
enqueues. Text prompts are tokenized in batches off the event loop (``PromptBatcher``) and
checked there, so bad input never reaches the engine; the requests they belong to are sent
to the engine from there too (``reserve``, then ``start_job`` from the tokenizer thread),
without waiting for the event loop.

With several data-parallel replicas (``serve --data-parallel-size``) each sequence goes to
the one the cache-aware routing policy (``infer.routing``) picks from its prompt's token
ids: the replica that was sent its longest prefix, unless that one is loaded well beyond
the others (the requests each runs or queues, its KV use, from its step counters). A
replica that fails leaves rotation; its sequences end with a 503, the others go on, and
the server stops only once none is left. Every API process routes on its own: each reaches
every replica, and a shared prefix may then be cached once per replica per API process at
most.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer.config import EngineConfig
from infer.contract.errors import QueueFullError
from infer.contract.messages import (
    Call,
    CallResult,
    EngineInfo,
    EngineSnapshot,
    Progress,
    StepEvents,
)
from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.contract.pipes import EngineLink, single_link
from infer.contract.prompts import Prompt, PromptEncoder
from infer.contract.sampling_params import SamplingParams
from infer.heap import IdleCollections
from infer.routing import DEFAULT_ROUTING, CacheAwarePolicy, NoWorkerError, RoutingSettings
from infer.server.bridge.placement import place_replicas
from infer.server.bridge.replica import EngineReplica
from infer.server.bridge.replica_totals import ReplicaReport, total_snapshot
from infer.server.guards.in_flight import InFlight
from infer.server.http.prompt_batcher import CHAT, PLAIN, OnEncoded, PromptBatcher, PromptOptions
from infer.tokenizer import Message, Tokenizer

if TYPE_CHECKING:
    from infer.engine.process import EngineFactory

logger = logging.getLogger(__name__)

Sequences = Sequence[tuple[list[int], SamplingParams]]
WARM_UP_TEXT = "Ready means warm."  # what the tokenizer encodes once at start
ENGINE_FAILED = "the engine failed"
NOT_STARTED = -1  # ``Job.replicas`` of a sequence not sent yet


class EngineStoppedError(RuntimeError):
    """The engine is not serving: the server is shutting down, or the engine failed."""


class RequestTimeoutError(RuntimeError):
    """The request ran longer than the server's ``--request-timeout``."""


class ChoiceUpdate:
    """What one sequence produced since its consumer last looked: the new tokens, text pieces
    and logprobs of every step in between, and its final output once it finished.

    Steps are joined by appending, so a consumer that falls behind pays per token only for
    list appends, and formats one chunk for all of them. (A plain class: one is made per
    stream per step, and a dataclass's default factories cost more than the rest of it.)"""

    __slots__ = ("final", "logprobs", "text_pieces", "token_ids")

    def __init__(self, token_ids: list[int], text: str, logprobs: list[TokenLogprob]) -> None:
        self.token_ids = list(token_ids)
        self.text_pieces = [text]
        self.logprobs = list(logprobs)
        self.final: RequestOutput | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_pieces)

    @property
    def finish_reason(self) -> str | None:
        return None if self.final is None else self.final.finish_reason

    def add(self, token_ids: list[int], text: str, logprobs: list[TokenLogprob]) -> None:
        self.token_ids += token_ids
        self.text_pieces.append(text)
        self.logprobs += logprobs


@dataclass(eq=False)
class Job:
    """The engine sequences of one HTTP request (``n`` per prompt) and their outputs.

    Iterating it yields lists of ``(index, ChoiceUpdate)``: one per sequence that made
    progress since the previous iteration, so a consumer that falls behind catches up in
    one go (a busy server writes fewer, larger chunks). ``close()`` it in all cases: it
    aborts what is still running and frees the capacity.
    """

    owner: EngineClient
    request_ids: list[str]
    deadline: float | None  # event-loop time
    submitted: float = field(default_factory=time.perf_counter)
    token_times: list[list[float]] = field(default_factory=list)  # per sequence
    finish_reasons: list[str | None] = field(default_factory=list)
    started: bool = False  # its sequences went to the engine
    closed: bool = False
    replicas: list[int] = field(default_factory=list)  # per sequence (``NOT_STARTED``)

    def __post_init__(self) -> None:
        count = len(self.request_ids)
        self.token_times = [[] for _ in self.request_ids]
        self.finish_reasons = [None] * count
        self.replicas = [NOT_STARTED] * count
        self.running: set[int] = set()  # sent to a replica, not finished there
        self._unfinished = set(range(len(self.request_ids)))
        self._ready: dict[int, ChoiceUpdate] = {}
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def __aiter__(self) -> Job:
        return self

    async def __anext__(self) -> list[tuple[int, ChoiceUpdate]]:
        if not self._unfinished:
            raise StopAsyncIteration
        if self.deadline is not None and asyncio.get_running_loop().time() >= self.deadline:
            raise self._timeout()
        while not self._ready and self._error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._wait(self._waiter)
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        ready, self._ready = self._ready, {}
        for index, update in ready.items():
            if update.final is not None:
                self._unfinished.discard(index)
        return list(ready.items())

    async def _wait(self, waiter: asyncio.Future[None]) -> None:
        if self.deadline is None:
            await waiter
            return
        try:
            async with asyncio.timeout_at(self.deadline):
                await waiter
        except TimeoutError:
            raise self._timeout() from None

    def _timeout(self) -> RequestTimeoutError:
        return RequestTimeoutError(
            f"the request exceeded the server's timeout ({self.owner.request_timeout} s)"
        )

    def put(self, index: int, progress: Progress, now: float) -> None:
        """A step's new tokens of sequence ``index``."""
        _, token_ids, text, logprobs = progress
        self._add(index, token_ids, text, logprobs, now)

    def finish(self, index: int, out: RequestOutput, now: float) -> None:
        """Sequence ``index`` finished (with its last step's tokens)."""
        self._add(index, out.new_token_ids, out.new_text, out.new_logprobs, now).final = out
        self.finish_reasons[index] = out.finish_reason

    def _add(
        self, index: int, token_ids: list[int], text: str, logprobs: list[TokenLogprob], now: float
    ) -> ChoiceUpdate:
        if token_ids:
            self.token_times[index].append(now)
        update = self._ready.get(index)
        if update is None:
            update = self._ready[index] = ChoiceUpdate(token_ids, text, logprobs)
            self._wake()
        else:
            update.add(token_ids, text, logprobs)
        return update

    def fail(self, exc: BaseException) -> None:
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @property
    def finished(self) -> bool:
        """Whether every sequence's final output was handed out."""
        return not self._unfinished

    @property
    def unfinished_request_ids(self) -> list[str]:
        return [self.request_ids[i] for i in sorted(self._unfinished)]

    def close(self) -> None:
        if not self.closed:
            self.owner.release(self)


class EngineClient:
    """Starts the engine process for ``config``, or one per data-parallel replica (or, in an
    API worker, reaches those running); ``submit`` work, iterate the ``Job``."""

    def __init__(
        self,
        config: EngineConfig,
        request_timeout: float | None = None,
        engine_factory: EngineFactory | None = None,
        links: Sequence[EngineLink] | None = None,
        in_flight: InFlight | None = None,
        routing: RoutingSettings = DEFAULT_ROUTING,
    ) -> None:
        """``links``: the pipes to each replica's engine (default: this process starts one
        engine, as the only API process); ``in_flight``: the count of unfinished sequences
        that this process shares with the server's other API processes, if any;
        ``routing``: the routing policy's thresholds, with several replicas (its block
        size is the engine's)."""
        if request_timeout is not None and request_timeout <= 0:
            raise ValueError(f"request_timeout: must be > 0 seconds, got {request_timeout}")
        if links is not None and not links:
            raise ValueError("links: give at least one engine's")
        self.config = config
        self.request_timeout = request_timeout
        self.engine_factory = engine_factory
        self._links = None if links is None else list(links)
        self._replica_capacity = config.max_batch_size + config.max_waiting_requests
        self.replicas: list[EngineReplica] = []
        self.error: str | None = None  # why the engine stopped serving (every replica)
        # Told why, once, if the engine fails while serving (the launcher exits then); with
        # several replicas, once the last one failed.
        self.on_failure: Callable[[str], None] | None = None
        self.accepting = False
        self._info: EngineInfo | None = None
        self._prompts: PromptEncoder | None = None
        self._jobs: dict[str, tuple[Job, int]] = {}  # engine request id → (job, index)
        # Full collections wait for a step after which no request is left (set by the app
        # once its start-up heap is frozen).
        self.collections: IdleCollections | None = None
        self._calls: dict[int, tuple[asyncio.Future[Any], EngineReplica]] = {}
        self._call_ids = itertools.count()
        self._in_flight = in_flight or InFlight()
        self._policy: CacheAwarePolicy | None = None
        if self.num_replicas > 1:
            self._policy = CacheAwarePolicy(replace(routing, tokens_per_block=config.block_size))
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: dict[int, asyncio.Future[EngineInfo]] = {}
        self._flush_scheduled = False
        self._batcher: PromptBatcher | None = None
        self._loop_thread: int | None = None
        self._queue_lock = threading.Lock()  # of the replicas' queues and routing

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def num_replicas(self) -> int:
        return 1 if self._links is None else len(self._links)

    async def start(self) -> None:
        """Start the engine processes and wait until each has loaded its model
        (``RuntimeError`` saying why when one cannot start)."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        links = self._links or [single_link()]
        placements = None
        if links[0].engine is not None:  # this process starts the engines
            placements = place_replicas(len(links), self.config)
        for index, link in enumerate(links):
            replica = EngineReplica(index, link, self)
            self._ready[index] = self._loop.create_future()
            self.replicas.append(replica)
            if self._policy is not None:
                self._policy.add_worker(replica.name)
        for replica in self.replicas:
            placement = None if placements is None else placements[replica.index]
            replica.start(self.config, self.engine_factory, placement)
        infos = await asyncio.gather(*self._ready.values())
        self._info = infos[0]
        _check_same_device(infos)
        self._prompts = await asyncio.to_thread(prompt_encoder, self._info)
        if self._prompts.tokenizer is not None:
            self._batcher = PromptBatcher(
                self._prompts, self._prompts.tokenizer, self._loop, after_batch=self.flush
            )
        self.accepting = True

    async def drain(self, timeout: float) -> None:
        """Stop accepting; give in-flight requests ``timeout`` seconds, then abort them."""
        self.accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._jobs and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self._jobs:
            logger.info("aborting %d in-flight sequences", len(self._jobs))
        self._fail_all(EngineStoppedError("the server is shutting down"))

    async def stop(self) -> None:
        """Abort everything, let the engines free their caches, and wait for their
        processes."""
        self.accepting = False
        self._stopping = True
        self._fail_all(EngineStoppedError("the server is shutting down"))
        for replica in self.replicas:
            replica.stopping = True
        await asyncio.gather(*(replica.stop() for replica in self.replicas))
        if self._batcher is not None:
            await asyncio.to_thread(self._batcher.close)
            self._batcher = None

    @property
    def is_healthy(self) -> bool:
        """Whether any replica serves."""
        return self.error is None and any(replica.healthy for replica in self.replicas)

    @property
    def capacity(self) -> int:
        """Sequences the server holds: ``max_batch_size + max_waiting_requests`` per replica
        in rotation."""
        serving = sum(replica.error is None for replica in self.replicas) or self.num_replicas
        return self._replica_capacity * serving

    @property
    def snapshot(self) -> EngineSnapshot:
        """The engines' counters after their latest steps, every replica's together."""
        return total_snapshot([replica.snapshot for replica in self.replicas])

    def replica_reports(self) -> list[ReplicaReport]:
        """Each replica's state, counters and requests routed there (by this process)."""
        routed = {} if self._policy is None else {w.name: w for w in self._policy.workers()}
        reports = []
        for replica in self.replicas:
            worker = routed.get(replica.name)
            reports.append(
                ReplicaReport(
                    replica.index,
                    replica.error,
                    replica.snapshot,
                    routed=0 if worker is None else worker.routed,
                    routed_by_prefix=0 if worker is None else worker.routed_by_prefix,
                )
            )
        return reports

    @property
    def outstanding(self) -> int:
        """Sequences submitted and not yet released, by every API process (what
        ``capacity`` bounds)."""
        return self._in_flight.total

    @property
    def info(self) -> EngineInfo:
        assert self._info is not None, "the engine has not started"
        return self._info

    @property
    def prompts(self) -> PromptEncoder:
        assert self._prompts is not None, "the engine has not started"
        return self._prompts

    # --- requests (event loop) -------------------------------------------------------------
    async def encode_prompts(
        self,
        prompts: Sequence[Prompt],
        on_encoded: OnEncoded | None = None,
        options: PromptOptions = PLAIN,
    ) -> list[list[int]]:
        """Token ids of each prompt, validated (``ValueError`` naming ``prompt``), after
        ``on_encoded`` ran on them: in the tokenizer thread when there is text to encode,
        here when there are only token ids (handing them to the thread would cost more than
        checking them) or no tokenizer (text is refused)."""
        if self._batcher is not None and any(isinstance(p, str) for p in prompts):
            return await self._batcher.encode_prompts(prompts, on_encoded, options)
        encoded = [self.prompts.encode_prompt(p, keep_last=options.keep_last) for p in prompts]
        return _encoded_here(on_encoded, encoded)

    async def encode_chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        on_encoded: OnEncoded | None = None,
        options: PromptOptions = CHAT,
    ) -> list[list[int]]:
        """A conversation's token ids through the chat template (one prompt), as
        ``encode_prompts`` gives a prompt's (``ValueError`` naming ``messages``)."""
        if self._batcher is None:  # no tokenizer: refused
            return _encoded_here(on_encoded, [self.prompts.encode_chat(messages, tools)])
        return await self._batcher.encode_chat(messages, tools, on_encoded, options)

    def reserve(self, job_id: str, count: int) -> Job:
        """A job for ``count`` sequences, counted against the capacity at once, its
        sequences given later (``start_job``); or raise at once: ``QueueFullError`` when the
        server holds ``capacity`` unfinished sequences, ``EngineStoppedError`` when it is not
        serving."""
        self._check_serving()
        capacity = self.capacity
        if count > capacity:
            raise ValueError(f"n: {count} sequences exceed what the server can hold ({capacity})")
        in_flight = self._in_flight.total
        if in_flight + count > capacity:
            raise QueueFullError(f"the server is at capacity ({in_flight} sequences in flight)")
        assert self._loop is not None
        timeout = self.request_timeout
        deadline = None if timeout is None else self._loop.time() + timeout
        job = Job(self, [f"{job_id}-{i}" for i in range(count)], deadline)
        self._in_flight.add(count)
        for index, request_id in enumerate(job.request_ids):
            self._jobs[request_id] = (job, index)
        return job

    def start_job(self, job: Job, sequences: Sequences) -> None:
        """Queue a reserved job's sequences for the engine (each for the replica the routing
        policy picks), unless it was closed meanwhile.

        Safe from any thread: the tokenizer thread starts the jobs it encoded, and sends
        each batch's in one message (``flush``); on the event loop, the jobs started during
        one turn go as one message."""
        assert len(sequences) == len(job.request_ids), "one sequence per reserved request id"
        lost: str | None = None
        with self._queue_lock:  # against ``release`` and failures: queued before, or not
            if job.closed:
                return
            job.started = True
            for index, (request_id, (ids, params)) in enumerate(zip(job.request_ids, sequences)):
                try:
                    replica = self._route(job, index, ids)
                except NoWorkerError as exc:
                    lost = str(exc)
                    break
                replica.adds.append((request_id, ids, params))
                if replica.error is not None:  # chosen just before its failure was noted
                    lost = f"replica {replica.index}: {replica.error}"
        if lost is not None:
            self._post(job.fail, EngineStoppedError(f"{ENGINE_FAILED}: {lost}"))
        if threading.get_ident() == self._loop_thread:
            self._schedule_flush()

    def _route(self, job: Job, index: int, ids: list[int]) -> EngineReplica:
        """The replica for sequence ``index`` of ``job``, counted running there (under the
        queue lock)."""
        if self._policy is None:
            replica = self.replicas[0]
        else:
            replica = self.replicas[int(self._policy.choose(ids).worker)]
        job.replicas[index] = replica.index
        job.running.add(index)
        return replica

    def submit(self, job_id: str, sequences: Sequences) -> Job:
        """``reserve`` and ``start_job`` in one (token ids, already checked)."""
        job = self.reserve(job_id, len(sequences))
        self.start_job(job, sequences)
        return job

    def release(self, job: Job) -> None:
        """Forget a job; abort its unfinished sequences (the engine frees their blocks)."""
        with self._queue_lock:
            job.closed = True
            for index in job.running:
                replica = self.replicas[job.replicas[index]]
                if replica.error is None:  # a failed one has forgotten them
                    replica.aborts.append(job.request_ids[index])
                if self._policy is not None:
                    self._policy.finish(replica.name)
            if job.running:
                job.running.clear()
                self._schedule_flush()
        for request_id in job.request_ids:
            self._jobs.pop(request_id, None)
        self._in_flight.add(-len(job.request_ids))

    async def call_each(self, name: str) -> list[Any | None]:
        """``call`` in every replica at once; None for each that failed."""

        async def one(replica: EngineReplica) -> Any | None:
            if replica.error is not None:
                return None
            try:
                return await self.call(name, replica.index)
            except EngineStoppedError:
                if replica.error is None:  # the server stops: no partial answer
                    raise
                return None

        return list(await asyncio.gather(*(one(replica) for replica in self.replicas)))

    async def call(self, name: str, replica: int | None = None) -> Any:
        """Call the engine's method ``name`` (e.g. ``cache_stats``) between two steps, in
        replica ``replica`` (None: the first that serves)."""
        self._check_serving(accepting=False)
        assert self._loop is not None
        if replica is None:
            target = next(r for r in self.replicas if r.error is None)
        else:
            target = self.replicas[replica]
            if target.error is not None:
                raise EngineStoppedError(f"{ENGINE_FAILED}: replica {replica}: {target.error}")
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._calls[call_id] = (future, target)
        self.flush()  # after what was queued before it
        target.send(Call(call_id, name))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            assert self._loop is not None
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Send what was queued since the last flush, one message each per replica: adds
        first (an abort may be for one of them). Safe from any thread."""
        with self._queue_lock:
            for replica in self.replicas:
                replica.send_queued()

    def _check_serving(self, accepting: bool = True) -> None:
        if self.error is not None:
            raise EngineStoppedError(f"{ENGINE_FAILED}: {self.error}")
        opened = any(replica.open for replica in self.replicas)
        if not opened or self._stopping or (accepting and not self.accepting):
            raise EngineStoppedError("the server is shutting down")

    # --- events from the replicas (event loop) ---------------------------------------------
    def replica_step(self, replica: EngineReplica, step: StepEvents) -> None:
        replica.snapshot = snapshot = step.snapshot
        now = time.perf_counter()
        jobs = self._jobs
        for item in step.progress:
            entry = jobs.get(item[0])
            if entry is not None:  # None: the job was closed while the step ran
                entry[0].put(entry[1], item, now)
        policy = self._policy
        for out in step.finished:
            entry = jobs.get(out.request_id)
            if entry is not None:
                job, index = entry
                job.finish(index, out, now)
                job.running.discard(index)
                if policy is not None:
                    policy.finish(replica.name)
        if policy is not None:
            # What it runs beyond what this process routed there: other API processes'.
            mine = next(w.in_flight for w in policy.workers() if w.name == replica.name)
            theirs = snapshot.num_running + snapshot.num_waiting - mine
            policy.report_load(replica.name, other_requests=theirs, kv_usage=snapshot.kv_usage)
        if self.collections is not None:
            self.collections.collect_if_due(idle=not jobs)

    def replica_call_result(self, result: CallResult) -> None:
        entry = self._calls.get(result.call_id)
        if entry is None or entry[0].done():
            return
        if result.error is not None:
            entry[0].set_exception(RuntimeError(result.error))
        else:
            entry[0].set_result(result.value)

    def replica_ready(self, replica: EngineReplica, info: EngineInfo) -> None:
        replica.info = info
        ready = self._ready.get(replica.index)
        if ready is not None and not ready.done():
            ready.set_result(info)

    def replica_failed(self, replica: EngineReplica, message: str) -> None:
        if self._stopping or replica.error is not None:
            return  # the process ended because it was told to
        with self._queue_lock:  # no sequence is routed there from now on
            replica.error = message
            if self._policy is not None:
                self._policy.set_healthy(replica.name, False)
        ready = self._ready.get(replica.index)
        if ready is not None and not ready.done():
            reason = message if self.num_replicas == 1 else f"replica {replica.index}: {message}"
            ready.set_exception(RuntimeError(f"the engine could not start: {reason}"))
        serving = [r for r in self.replicas if r.error is None]
        if not serving:
            self._engine_failed(message)
            return
        logger.error("replica %d stopped serving: %s (%d of %d serve on)", replica.index,
                     message, len(serving), len(self.replicas))  # fmt: skip
        error = EngineStoppedError(f"{ENGINE_FAILED}: replica {replica.index}: {message}")
        for job in {job for job, _ in self._jobs.values()}:
            if any(job.replicas[index] == replica.index for index in job.running):
                job.fail(error)
        for future, target in self._calls.values():
            if target is replica and not future.done():
                future.set_exception(error)

    def _engine_failed(self, message: str) -> None:
        """No replica serves any more."""
        logger.error("the engine stopped serving: %s", message)
        self.error = message
        self.accepting = False
        self._fail_all(EngineStoppedError(f"{ENGINE_FAILED}: {message}"))
        if self.on_failure is not None:
            self.on_failure(message)

    def _fail_all(self, exc: BaseException) -> None:
        for job in {job for job, _ in self._jobs.values()}:
            job.fail(exc)
        for future, _ in self._calls.values():
            if not future.done():
                future.set_exception(exc)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` on the event loop (from any thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)


def _check_same_device(infos: Sequence[EngineInfo]) -> None:
    """``RuntimeError`` when the replicas found different devices: one that found no GPU of
    its own runs on the CPU while the others run on theirs."""
    kinds = [info.device_type for info in infos]
    if len({kind for kind in kinds if kind is not None}) > 1:
        on_cpu = [str(i) for i, kind in enumerate(kinds) if kind == "cpu"]
        raise RuntimeError(
            f"the engine could not start: data_parallel_size: replica {', '.join(on_cpu)} "
            f"found no GPU of its own and would run on the CPU (replica i takes GPUs "
            f"i*tensor_parallel_size and up, of those visible)"
        )


def _encoded_here(on_encoded: OnEncoded | None, prompts: list[list[int]]) -> list[list[int]]:
    """``prompts``, after ``on_encoded`` ran on them on the event loop (nothing to
    tokenize, so the tokenizer thread is not asked)."""
    if on_encoded is not None:
        on_encoded(prompts)
    return prompts


def prompt_encoder(info: EngineInfo) -> PromptEncoder:
    """The engine's prompt rules with its tokenizer (a GGUF's conversion comes from the
    cache the engine process filled)."""
    tokenizer = None
    if info.tokenizer_path is not None:
        tokenizer = Tokenizer.load(Path(info.tokenizer_path), info.eos_token_ids)
    prompts = PromptEncoder(tokenizer, info.vocab_size, info.max_seq_len)
    warm_up_prompts(prompts)
    return prompts


def warm_up_prompts(prompts: PromptEncoder) -> None:
    """Encode a text and a conversation once, before the server says it is ready: the
    tokenizer's first call and the chat template's compile are paid here, not by the
    first requests. A model without a chat template is fine."""
    if prompts.tokenizer is None:
        return
    prompts.tokenizer.encode_batch([WARM_UP_TEXT])
    try:
        prompts.encode_chat([{"role": "user", "content": WARM_UP_TEXT}])
    except Exception as exc:  # its chat requests will say why
        logger.debug("no chat template to warm up: %s", exc)
