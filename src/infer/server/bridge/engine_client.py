"""The API process's side of the engine: submit work, read each request's outputs.

The engine runs in its own process (``engine/process.py``). Commands go to it through a
sender thread (so the event loop never blocks on a full pipe) and a reader thread hands
every step's outputs to the event loop in one ``call_soon_threadsafe``. Requests added
or aborted during one turn of the event loop go to the engine as one message. The HTTP side
never waits for the engine to accept work: it decides backpressure from its own count of
unfinished sequences, then only enqueues. Text prompts are tokenized in batches off the
event loop (``PromptBatcher``) and checked there, so bad input never reaches the engine;
the requests they belong to are sent to the engine from there too (``reserve``, then
``start_job`` from the tokenizer thread), without waiting for the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer.config import EngineConfig
from infer.contract.errors import QueueFullError
from infer.contract.messages import (
    Abort,
    AddRequests,
    Call,
    CallResult,
    Command,
    EngineFailed,
    EngineInfo,
    EngineSnapshot,
    NewRequest,
    Progress,
    Ready,
    StepEvents,
    Stop,
)
from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.contract.pipes import EngineLink, PipeEnds, single_link
from infer.contract.prompts import Prompt, PromptEncoder
from infer.contract.sampling_params import SamplingParams
from infer.heap import IdleCollections
from infer.server.guards.in_flight import InFlight
from infer.server.http.prompt_batcher import CHAT, PLAIN, OnEncoded, PromptBatcher, PromptOptions
from infer.tokenizer import Message, Tokenizer

if TYPE_CHECKING:
    from infer.engine.process import EngineFactory

logger = logging.getLogger(__name__)

Sequences = Sequence[tuple[list[int], SamplingParams]]
STOP_TIMEOUT_S = 60.0
WARM_UP_TEXT = "Ready means warm."  # what the tokenizer encodes once at start
ENGINE_FAILED = "the engine failed"
# The engine process's main, named, not imported: the API process never loads the engine
# (torch, the model's code); the engine process imports it (``_engine_main``).
ENGINE_MAIN = "infer.engine.process"


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

    def __post_init__(self) -> None:
        self.token_times = [[] for _ in self.request_ids]
        self.finish_reasons = [None] * len(self.request_ids)
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
    def unfinished_request_ids(self) -> list[str]:
        return [self.request_ids[i] for i in sorted(self._unfinished)]

    def close(self) -> None:
        if not self.closed:
            self.owner.release(self)


class EngineClient:
    """Starts the engine process for ``config`` (or, in an API worker, reaches the one
    running); ``submit`` work, iterate the ``Job``."""

    def __init__(
        self,
        config: EngineConfig,
        request_timeout: float | None = None,
        engine_factory: EngineFactory | None = None,
        link: EngineLink | None = None,
        in_flight: InFlight | None = None,
    ) -> None:
        """``link``: the pipes to the engine (default: this process starts the engine, as
        the only API process); ``in_flight``: the count of unfinished sequences that this
        process shares with the server's other API processes, if any."""
        if request_timeout is not None and request_timeout <= 0:
            raise ValueError(f"request_timeout: must be > 0 seconds, got {request_timeout}")
        self.config = config
        self.request_timeout = request_timeout
        self.engine_factory = engine_factory
        self.capacity = config.max_batch_size + config.max_waiting_requests
        self.snapshot = EngineSnapshot()
        self.error: str | None = None  # why the engine stopped serving, if it failed
        # Told why, once, if the engine fails while serving (the launcher exits then).
        self.on_failure: Callable[[str], None] | None = None
        self.accepting = False
        self._info: EngineInfo | None = None
        self._prompts: PromptEncoder | None = None
        self._jobs: dict[str, tuple[Job, int]] = {}  # engine request id → (job, index)
        # Full collections wait for a step after which no request is left (set by the app
        # once its start-up heap is frozen).
        self.collections: IdleCollections | None = None
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._in_flight = in_flight or InFlight()
        self._link = link
        self._attached = link is not None and link.engine is None  # an API worker
        self._link_open = False
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[EngineInfo] | None = None
        self._process: BaseProcess | None = None
        self._outbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        # Not sent yet: one message per event-loop turn or tokenizer batch (``flush``).
        self._adds: list[NewRequest] = []
        self._aborts: list[str] = []
        self._flush_scheduled = False
        self._threads: list[threading.Thread] = []
        self._batcher: PromptBatcher | None = None
        self._loop_thread: int | None = None
        self._queue_lock = threading.Lock()  # of ``_adds`` and ``_aborts``

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the engine process and wait until its model is loaded (``RuntimeError``
        saying why when it cannot start)."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._ready = self._loop.create_future()
        link = self._link or single_link()
        if link.engine is not None:
            context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
            self._process = context.Process(
                target=_engine_main,
                args=(self.config, link.engine, self.engine_factory),
                name="infer-engine",
                daemon=True,
            )
            self._process.start()
            for ends in link.engine:  # the child's: closed here, so a dead child reads as EOF
                ends.close()
        self._link_open = True
        self._threads = [
            threading.Thread(target=self._send, args=(link.api.commands,), name="infer-send"),
            threading.Thread(target=self._receive, args=(link.api.events,), name="infer-receive"),
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()
        self._info = await self._ready
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
        """Abort everything, let the engine free its cache, and wait for its process."""
        self.accepting = False
        self._stopping = True
        self._fail_all(EngineStoppedError("the server is shutting down"))
        if self._attached and self._link_open:  # the engine forgets us once our pipe closes
            self._outbox.put(None)
            for thread in self._threads:
                await asyncio.to_thread(thread.join, STOP_TIMEOUT_S)
            self._link_open = False
        process = self._process
        if process is not None:
            self._outbox.put(Stop())
            self._outbox.put(None)  # ends the sender thread
            await asyncio.to_thread(process.join, STOP_TIMEOUT_S)
            if process.is_alive():
                logger.warning("the engine process did not stop; killing it")
                process.kill()
                await asyncio.to_thread(process.join)
            for thread in self._threads:
                await asyncio.to_thread(thread.join)
            self._process = None
        if self._batcher is not None:
            await asyncio.to_thread(self._batcher.close)
            self._batcher = None

    @property
    def is_healthy(self) -> bool:
        if self.error is not None:
            return False
        if self._attached:
            return self._link_open and not self._stopping
        process = self._process
        return process is not None and process.is_alive()

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
        server holds ``max_batch_size + max_waiting_requests`` unfinished sequences,
        ``EngineStoppedError`` when it is not serving."""
        self._check_serving()
        if count > self.capacity:
            raise ValueError(
                f"n: {count} sequences exceed what the server can hold ({self.capacity})"
            )
        in_flight = self._in_flight.total
        if in_flight + count > self.capacity:
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
        """Queue a reserved job's sequences for the engine, unless it was closed meanwhile.

        Safe from any thread: the tokenizer thread starts the jobs it encoded, and sends
        each batch's in one message (``flush``); on the event loop, the jobs started during
        one turn go as one message."""
        assert len(sequences) == len(job.request_ids), "one sequence per reserved request id"
        adds = [(rid, ids, params) for rid, (ids, params) in zip(job.request_ids, sequences)]
        with self._queue_lock:  # against ``release``: queued before it, or not at all
            if job.closed:
                return
            job.started = True
            self._adds += adds
        if threading.get_ident() == self._loop_thread:
            self._schedule_flush()

    def submit(self, job_id: str, sequences: Sequences) -> Job:
        """``reserve`` and ``start_job`` in one (token ids, already checked)."""
        job = self.reserve(job_id, len(sequences))
        self.start_job(job, sequences)
        return job

    def release(self, job: Job) -> None:
        """Forget a job; abort its unfinished sequences (the engine frees their blocks)."""
        with self._queue_lock:
            job.closed = True
            if job.started and (unfinished := job.unfinished_request_ids):
                self._aborts += unfinished
                self._schedule_flush()
        for request_id in job.request_ids:
            self._jobs.pop(request_id, None)
        self._in_flight.add(-len(job.request_ids))

    async def call(self, name: str) -> Any:
        """Call the engine's method ``name`` (e.g. ``cache_stats``) between two steps."""
        self._check_serving(accepting=False)
        assert self._loop is not None
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._calls[call_id] = future
        self._flush()  # after what was queued before it
        self._outbox.put(Call(call_id, name))
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
        """Send what was queued since the last flush, one message each: adds first (an
        abort may be for one of them). Safe from any thread."""
        with self._queue_lock:
            if self._adds:
                self._outbox.put(AddRequests(self._adds))
                self._adds = []
            if self._aborts:
                self._outbox.put(Abort(self._aborts))
                self._aborts = []

    def _check_serving(self, accepting: bool = True) -> None:
        if self.error is not None:
            raise EngineStoppedError(f"{ENGINE_FAILED}: {self.error}")
        if not self._link_open or self._stopping or (accepting and not self.accepting):
            raise EngineStoppedError("the server is shutting down")

    # --- events from the engine (event loop) -----------------------------------------------
    def _dispatch(self, step: StepEvents) -> None:
        self.snapshot = step.snapshot
        now = time.perf_counter()
        jobs = self._jobs
        for item in step.progress:
            entry = jobs.get(item[0])
            if entry is not None:  # None: the job was closed while the step ran
                entry[0].put(entry[1], item, now)
        for out in step.finished:
            entry = jobs.get(out.request_id)
            if entry is not None:
                entry[0].finish(entry[1], out, now)
        if self.collections is not None:
            self.collections.collect_if_due(idle=not jobs)

    def _resolve_call(self, result: CallResult) -> None:
        future = self._calls.get(result.call_id)
        if future is None or future.done():
            return
        if result.error is not None:
            future.set_exception(RuntimeError(result.error))
        else:
            future.set_result(result.value)

    def _ready_event(self, info: EngineInfo) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(info)

    def _engine_failed(self, message: str) -> None:
        if self._stopping:
            return  # the process ended because it was told to
        logger.error("the engine stopped serving: %s", message)
        self.error = message
        self.accepting = False
        error = EngineStoppedError(f"{ENGINE_FAILED}: {message}")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(RuntimeError(f"the engine could not start: {message}"))
        self._fail_all(error)
        if self.on_failure is not None:
            self.on_failure(message)

    def _fail_all(self, exc: BaseException) -> None:
        for job in {job for job, _ in self._jobs.values()}:
            job.fail(exc)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(exc)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens any more
            self._loop.call_soon_threadsafe(fn, *args)

    # --- the pipe threads ------------------------------------------------------------------
    def _send(self, commands: Connection) -> None:
        with commands:
            while (command := self._outbox.get()) is not None:
                try:
                    commands.send(command)
                except OSError:  # the engine process is gone; the receiver reports it
                    return

    def _receive(self, events: Connection) -> None:
        with events:
            try:
                while True:
                    match events.recv():
                        case StepEvents() as step:
                            self._post(self._dispatch, step)
                        case CallResult() as result:
                            self._post(self._resolve_call, result)
                        case Ready(info):
                            self._post(self._ready_event, info)
                        case EngineFailed(message):  # the engine process is ending
                            self._post(self._engine_failed, message)
                            return
            except (EOFError, OSError):
                if self._stopping:  # told to stop: ``stop`` waits for the process (two
                    return  # threads waiting for it race, and one may find it "alive")
                if self._process is None:  # an API worker: the engine is not our child
                    self._post(self._engine_failed, "the engine process went away")
                    return
                self._process.join(5.0)
                code = self._process.exitcode
                self._post(self._engine_failed, f"the engine process exited (exit code {code})")


def _engine_main(
    config: EngineConfig, links: Sequence[PipeEnds], engine_factory: EngineFactory | None
) -> None:
    """The engine process's target: it imports the engine there, by module path."""
    importlib.import_module(ENGINE_MAIN).run_engine(config, links, engine_factory)


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
