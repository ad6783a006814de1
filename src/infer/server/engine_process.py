"""The engine's own process: it owns the ``Engine`` and loops over commands and steps.

The server's event loop and the engine's per-step Python work would fight over one GIL if
they shared a process (at thousands of tokens per second, streaming each token costs the
event loop about as much host time as the step itself), so the engine runs here and talks
to the API process over two pipes, with the typed messages of ``messages.py``:

- commands in: ``AddRequests`` and ``Abort`` (each for all the requests the API process
  queued since its last message), ``Call`` (an engine method, e.g. ``cache_stats``), ``Stop``;
- events out: ``Ready`` once, then one ``StepEvents`` after every step (all requests'
  progress: compact tuples, cheap to pickle; whole ``RequestOutput``s of finished ones),
  ``CallResult`` per ``Call``, and ``EngineFailed`` if the engine cannot go on.

Each iteration waits until the step in flight is about to end (``Engine.wait_to_schedule``),
runs every queued command, then one ``engine.step()``. While nothing runs it blocks on the
command pipe. Signals are ignored here: the API process decides when to
stop, and the engine exits when told to or when the API process's end of the pipe closes.
"""

from __future__ import annotations

import logging
import pickle
import queue
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

from infer.config import EngineConfig
from infer.engine.engine import Engine
from infer.engine.prompts import Prompt
from infer.engine.request import RequestOutput
from infer.engine.sampling_params import SamplingParams
from infer.heap import IdleCollections, freeze_heap
from infer.server.messages import (
    Abort,
    AddRequests,
    Call,
    CallResult,
    Command,
    EngineFailed,
    EngineInfo,
    EngineSnapshot,
    Event,
    NewRequest,
    Progress,
    Ready,
    StepEvents,
    Stop,
)

logger = logging.getLogger(__name__)

_CALLABLE = frozenset({"cache_stats"})  # engine methods the API process may call


class _Preemptions(Protocol):
    @property
    def preemptions(self) -> int: ...


class ServedEngine(Protocol):
    """What the engine loop drives: ``Engine``, or a stand-in that measures the API
    process alone (``standin.py``)."""

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str: ...

    def abort(self, request_id: str) -> bool: ...

    def has_unfinished_requests(self) -> bool: ...

    def wait_to_schedule(self) -> None: ...

    def step(self) -> list[RequestOutput]: ...

    def utilization(self) -> float: ...

    def cache_stats(self) -> dict[str, float | int | str]: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_generated_tokens(self) -> int: ...

    @property
    def scheduler(self) -> _Preemptions: ...


# Builds the engine in the engine process (so it must pickle: a module-level function).
EngineFactory = Callable[[EngineConfig], tuple[ServedEngine, EngineInfo]]


def load_engine(config: EngineConfig) -> tuple[ServedEngine, EngineInfo]:
    """The real engine, and what the API process needs to know about it."""
    engine = Engine(config)
    pool = engine.pool
    tokenizer_path = config.tokenizer or engine.source.tokenizer_path
    info = EngineInfo(
        max_seq_len=engine.max_seq_len,
        kv_capacity_tokens=pool.num_blocks * pool.block_size,
        vocab_size=engine.model_config.vocab_size,
        tokenizer_path=None if tokenizer_path is None else str(tokenizer_path),
        eos_token_ids=tuple(engine.model_config.eos_token_ids),
    )
    return engine, info


def run_engine(
    config: EngineConfig,
    commands: Connection,
    events: Connection,
    engine_factory: EngineFactory = load_engine,
) -> None:
    """Entry point of the engine process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        engine, info = engine_factory(config)
    except Exception as exc:
        logger.exception("the engine could not start")
        events.send(EngineFailed(f"{type(exc).__name__}: {exc}"))
        return
    freeze_heap()  # the model, caches and CUDA graphs stay; per-step garbage does not
    events.send(Ready(info))
    outbox = _Outbox(events)
    try:
        with IdleCollections() as collections:
            _EngineLoop(engine, commands, outbox, collections).run()
    except (EOFError, BrokenPipeError):  # the API process went away
        pass
    except Exception as exc:
        logger.exception("the engine loop failed")
        outbox.send(EngineFailed(f"{type(exc).__name__}: {exc}"))
    finally:
        outbox.close()


class _Outbox:
    """Sends events from a thread of its own, so the engine never waits for the API process
    to read them (a full pipe would otherwise stall the step loop while HTTP catches up).

    Events are pickled here, on the engine's thread (~50 µs for 256 rows): the sending
    thread then needs the GIL only for moments (the write releases it), instead of for each
    step's pickling while the engine's thread is busy. (``benchmarks/host_step_cpu.py
    --served`` could not tell the two apart within the CPU's noise.)"""

    def __init__(self, events: Connection) -> None:
        self._events = events
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="infer-events", daemon=True)
        self._thread.start()

    def send(self, event: Event) -> None:
        self._queue.put(pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (payload := self._queue.get()) is not None:
            try:
                self._events.send_bytes(payload)  # read by ``Connection.recv`` (unpickled)
            except (BrokenPipeError, OSError):  # the API process went away
                return


class _EngineLoop:
    def __init__(
        self,
        engine: ServedEngine,
        commands: Connection,
        events: _Outbox,
        collections: IdleCollections,
    ) -> None:
        self.engine = engine
        self.commands = commands
        self.events = events
        self.collections = collections
        self.active: set[str] = set()

    def run(self) -> None:
        while True:
            busy = self.engine.has_unfinished_requests()
            self.collections.collect_if_due(idle=not busy)
            if busy:
                self.engine.wait_to_schedule()  # requests that come meanwhile join the next step
            if not self._run_commands():
                return
            if self.engine.has_unfinished_requests():
                self._send_step(self.engine.step())

    def _run_commands(self) -> bool:
        """Run the queued commands (waiting for one while idle); False on stop."""
        idle = not self.engine.has_unfinished_requests()
        ran = False
        while (idle and not ran) or self.commands.poll():
            command: Command = self.commands.recv()
            ran = True
            match command:
                case AddRequests(requests):
                    self._add(requests)
                case Abort(request_ids):
                    self._abort(request_ids)
                case Call(call_id, name):
                    self.events.send(self._call(call_id, name))
                case Stop():
                    self._abort_all()
                    return False
        if idle and ran:
            self._send_step([])  # e.g. aborts of waiting requests: the counters changed
        return True

    def _add(self, requests: list[NewRequest]) -> None:
        """Queue them in the engine (its queue is not bounded: the API process bounds how
        many it sends)."""
        for request_id, token_ids, params in requests:
            try:
                self.engine.add_request(token_ids, params, request_id)
            except ValueError as exc:  # validated by the API process; kept as a safety net
                self._send_step([_failed(request_id, str(exc))])
            else:
                self.active.add(request_id)

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if request_id in self.active:
                self.engine.abort(request_id)
                self.active.discard(request_id)

    def _call(self, call_id: int, name: str) -> CallResult:
        if name not in _CALLABLE:
            return CallResult(call_id, None, f"{name}: not an engine call")
        try:
            value: Any = getattr(self.engine, name)()
        except Exception as exc:
            return CallResult(call_id, None, f"{type(exc).__name__}: {exc}")
        return CallResult(call_id, value, None)

    def _abort_all(self) -> None:
        for request_id in self.active:
            self.engine.abort(request_id)
        self.active.clear()
        while self.engine.has_unfinished_requests():
            self.engine.step()  # retires the aborted requests (and a step in flight)
        self._send_step([])

    def _send_step(self, outputs: list[RequestOutput]) -> None:
        progress: list[Progress] = []
        finished: list[RequestOutput] = []
        for out in outputs:
            if out.finished:
                finished.append(out)
                self.active.discard(out.request_id)
            else:
                progress.append((out.request_id, out.new_token_ids, out.new_text, out.new_logprobs))
        engine = self.engine
        snapshot = EngineSnapshot(
            num_running=engine.num_running,
            num_waiting=engine.num_waiting,
            kv_usage=engine.utilization(),
            preemptions=engine.scheduler.preemptions,
            prompt_tokens=engine.num_prompt_tokens,
            generation_tokens=engine.num_generated_tokens,
        )
        self.events.send(StepEvents(progress, finished, snapshot))


def _failed(request_id: str, error: str) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        prompt_token_ids=[],
        new_token_ids=[],
        new_text="",
        token_ids=[],
        text="",
        finished=True,
        finish_reason="error",
        error=error,
    )
