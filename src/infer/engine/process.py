"""The engine's own process: it owns the ``Engine`` and loops over commands and steps. The
API process starts it by module path (``server/bridge/replica.py``), so that it never
imports the engine itself.

The server's event loop and the engine's per-step Python work would fight over one GIL if
they shared a process (at thousands of tokens per second, streaming each token costs the
event loop about as much host time as the step itself), so the engine runs here and talks
to each API process (one, or several: ``server/bridge/api_workers.py``) over a pair of
pipes of its own (``contract/pipes.py``), with the typed messages of
``contract/messages.py``:

- commands in: ``AddRequests`` and ``Abort`` (each for all the requests the API process
  queued since its last message), ``Call`` (an engine method, e.g. ``cache_stats``), ``Stop``;
- events out: ``Ready`` once, then one ``StepEvents`` after every step (that process's
  requests' progress: compact tuples, cheap to pickle; whole ``RequestOutput``s of finished
  ones; the engine's counters), ``CallResult`` per ``Call``, and ``EngineFailed`` if the
  engine cannot go on.

The engine is driven by ``engine/loop.py``'s loop, this process's commands its feed: each
iteration waits until the step in flight is about to end (``Engine.wait_to_schedule``), runs
every queued command, then one ``engine.step()``. While nothing runs it blocks on the
command pipes. Signals are ignored here: the API process that started the engine decides
when to stop, and the engine exits when told to or when that process's end of the pipe
closes. When an API worker's pipe closes, its requests are aborted and the rest go on.

One of several data-parallel replicas (``serve --data-parallel-size``) is such a process
too, placed by the API process (``contract/placement.py``): its environment was set before
torch was loaded; here its tensor-parallel group gets its own port, and it fails at once,
saying why, when the GPUs it was given are not there.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import queue
import signal
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as connection_wait
from typing import Any, Protocol

import torch

from infer.config import EngineConfig
from infer.contract.messages import (
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
from infer.contract.outputs import RequestOutput
from infer.contract.pipes import PipeEnds
from infer.contract.placement import ReplicaPlacement
from infer.contract.prompts import Prompt
from infer.contract.sampling_params import SamplingParams
from infer.contract.speculation_stats import SpeculationStats
from infer.engine.core.engine import Engine
from infer.engine.core.wakeup import STALL_CHECK_S, Wakeup
from infer.engine.loop import SteppedEngine, drain, drive
from infer.heap import IdleCollections, freeze_heap

logger = logging.getLogger(__name__)

_CALLABLE = frozenset({"cache_stats", "dashboard_view"})  # engine methods the API may call


class _SchedulerCounters(Protocol):
    @property
    def preemptions(self) -> int: ...

    @property
    def speculation(self) -> SpeculationStats: ...


class ServedEngine(SteppedEngine[RequestOutput], Protocol):
    """What the engine loop drives: ``Engine``, or a stand-in that measures the API
    process alone (``standin.py``)."""

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str: ...

    def abort(self, request_id: str) -> bool: ...

    @property
    def wakeup(self) -> Wakeup:
        """Set when a request that could not run (``stalled``) may run now."""
        ...

    def utilization(self) -> float: ...

    def cache_stats(self) -> dict[str, float | int | str]: ...

    def close(self) -> None:
        """Release what outlives the process otherwise (tensor-parallel workers)."""
        ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_generated_tokens(self) -> int: ...

    @property
    def num_structured_output_errors(self) -> int: ...

    @property
    def scheduler(self) -> _SchedulerCounters: ...


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
        device_type=config.resolved_device.type,
    )
    return engine, info


def placed_config(config: EngineConfig, placement: ReplicaPlacement) -> EngineConfig:
    """``config`` for one replica: its tensor-parallel group's port; ``ValueError`` when
    fewer GPUs are visible to it than its ranks need."""
    if placement.master_port is not None:
        config = replace(config, master_port=placement.master_port)
    if placement.gpus is not None and config.resolved_device.type == "cuda":
        visible = torch.cuda.device_count()
        needed = config.tensor_parallel_size
        if visible < needed:
            gpus = ",".join(placement.gpus) or "none"
            raise ValueError(
                f"data_parallel_size: {placement.describe()} runs on GPUs {gpus} (its "
                f"tensor_parallel_size of those visible, after the replicas before it), but "
                f"{visible} of them {'is' if visible == 1 else 'are'} there"
            )
    return config


def run_engine(
    config: EngineConfig,
    links: Sequence[PipeEnds],
    engine_factory: EngineFactory | None = None,
    placement: ReplicaPlacement | None = None,
) -> None:
    """Entry point of the engine process: ``links`` are its ends of each API process's
    pipes, the first of the process that started it; ``engine_factory`` builds the engine
    (None: ``load_engine``); ``placement``: where it runs, as one replica of several.

    The process ends as soon as this returns, once its events are sent and the engine is
    closed (its tensor-parallel workers stopped): tearing down an interpreter with torch
    and a model loaded made every shutdown seconds longer
    (``benchmarks/results-by-topic/09-reliability.md``, 9.4)."""
    code = 1  # an exception escaped (its traceback is printed)
    try:
        _run_engine(config, links, engine_factory or load_engine, placement)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # multiprocessing's among them: it releases semaphores
        logging.shutdown()
        os._exit(code)


def _run_engine(
    config: EngineConfig,
    links: Sequence[PipeEnds],
    engine_factory: EngineFactory,
    placement: ReplicaPlacement | None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    who = "" if placement is None else f"[replica {placement.index}] "
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s {who}%(name)s: %(message)s")
    apis = [_ApiLink(ends) for ends in links]
    try:
        try:
            if placement is not None:
                config = placed_config(config, placement)
            engine, info = engine_factory(config)
        except Exception as exc:
            logger.exception("the engine could not start")
            for api in apis:
                api.outbox.send(EngineFailed(f"{type(exc).__name__}: {exc}"))
            return
        _fail_on_dead_worker(engine, apis)
        freeze_heap()  # the model, caches and CUDA graphs stay; per-step garbage does not
        for api in apis:
            api.outbox.send(Ready(info))
        try:
            with IdleCollections() as collections:
                _EngineLoop(engine, apis, collections).run()
        except (EOFError, BrokenPipeError):  # the process that started the engine went away
            pass
        except Exception as exc:
            logger.exception("the engine loop failed")
            for api in apis:
                api.outbox.send(EngineFailed(f"{type(exc).__name__}: {exc}"))
        finally:
            engine.close()
    finally:
        for api in apis:
            api.outbox.close()


def _fail_on_dead_worker(engine: ServedEngine, apis: list[_ApiLink]) -> None:
    """A tensor-parallel worker that dies ends the engine process at once, however busy its
    loop is (it may be waiting for the dead worker in a collective): every API process is
    told why, then sees the process exit, as for a dead engine."""
    workers = engine.workers if isinstance(engine, Engine) else None
    if workers is None:
        return

    def fail(message: str) -> None:
        logger.error("the engine stops: %s", message)
        for api in apis:
            api.outbox.send(EngineFailed(message))
            api.outbox.close()
        os._exit(1)

    workers.watch(fail)


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
        """Send what is queued, then close the pipe (its reader sees the end)."""
        self._queue.put(None)
        self._thread.join()
        self._events.close()

    def _run(self) -> None:
        while (payload := self._queue.get()) is not None:
            try:
                self._events.send_bytes(payload)  # read by ``Connection.recv`` (unpickled)
            except (BrokenPipeError, OSError):  # the API process went away
                return


class _ApiLink:
    """One API process as the engine loop sees it: its commands, and its events' outbox
    with what this step gives its requests (step outputs go to the process that sent them)."""

    def __init__(self, ends: PipeEnds) -> None:
        self.commands = ends.commands
        self.outbox = _Outbox(ends.events)
        self.progress: list[Progress] = []  # this step's, until sent
        self.finished: list[RequestOutput] = []


class _EngineLoop:
    def __init__(
        self, engine: ServedEngine, apis: list[_ApiLink], collections: IdleCollections
    ) -> None:
        self.engine = engine
        self.apis = list(apis)  # the first: the process that started the engine
        self.collections = collections
        self.owners: dict[str, _ApiLink] = {}  # each unfinished request's API process
        # Calls wait for the end of the step (``put_out``): answered then, while the device
        # runs the step queued ahead, they cost the host's slack, not a launch's delay.
        self.calls: list[tuple[_ApiLink, int, str]] = []

    def run(self) -> None:
        drive(self.engine, self)

    # --- the loop's feed -------------------------------------------------------------------
    def may_take_in(self) -> bool:
        return True

    def take_in(self, idle: bool) -> bool:
        """Run the queued commands of every API process; False on stop. While the engine
        has nothing to run (no requests, or only ones whose grammars compile) it blocks
        until a command comes or the engine's wake-up is set: an idle engine costs no CPU."""
        engine = self.engine
        self.collections.collect_if_due(idle=not engine.has_unfinished_requests())
        ran = False
        while True:
            if idle and not ran:
                timeout = STALL_CHECK_S if engine.stalled else None
                waited: list[Connection | int] = [api.commands for api in self.apis]
                waited.append(engine.wakeup.fileno())
                connection_wait(waited, timeout)
                engine.wakeup.clear()
            ready = [api for api in self.apis if api.commands.poll()]
            if not ready:
                break
            for api in ready:
                ran = True
                try:
                    command: Command = api.commands.recv()
                except EOFError:
                    if api is self.apis[0]:
                        raise  # the process that started the engine went away: so do we
                    self._forget(api)
                    continue
                match command:
                    case AddRequests(requests):
                        self._add(api, requests)
                    case Abort(request_ids):
                        self._abort(request_ids)
                    case Call(call_id, name):
                        self.calls.append((api, call_id, name))
                    case Stop():
                        self._abort_all()
                        return False
        if idle and ran:
            self.put_out([])  # e.g. aborts of waiting requests: the counters changed
        elif not engine.has_unfinished_requests():
            self._answer_calls()  # no step comes to answer them after
        return True

    def _add(self, api: _ApiLink, requests: list[NewRequest]) -> None:
        """Queue them in the engine (its queue is not bounded: the API processes bound how
        many they send)."""
        for request_id, token_ids, params in requests:
            self.owners[request_id] = api
            try:
                self.engine.add_request(token_ids, params, request_id)
            except ValueError as exc:  # validated by the API process; kept as a safety net
                self.put_out([_failed(request_id, str(exc))])

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            api = self.owners.pop(request_id, None)
            if api is not None:
                self.engine.abort(request_id)

    def _forget(self, api: _ApiLink) -> None:
        """An API worker went away: abort its requests, stop sending it events."""
        orphans = [request_id for request_id, owner in self.owners.items() if owner is api]
        if orphans:
            logger.warning("an API process went away; aborting its %d requests", len(orphans))
        self._abort(orphans)
        self.apis.remove(api)
        api.outbox.close()

    def _answer_calls(self) -> None:
        calls, self.calls = self.calls, []
        for api, call_id, name in calls:
            if api in self.apis:  # (not an API worker gone meanwhile)
                api.outbox.send(self._call(call_id, name))

    def _call(self, call_id: int, name: str) -> CallResult:
        if name not in _CALLABLE:
            return CallResult(call_id, None, f"{name}: not an engine call")
        try:
            value: Any = getattr(self.engine, name)()
        except Exception as exc:
            return CallResult(call_id, None, f"{type(exc).__name__}: {exc}")
        return CallResult(call_id, value, None)

    def _abort_all(self) -> None:
        self._abort(list(self.owners))
        drain(self.engine)  # retires the aborted requests (and a step in flight)
        self.put_out([])

    def put_out(self, outputs: Sequence[RequestOutput]) -> None:
        """Each API process gets its requests' progress and the engine's counters."""
        owners = self.owners
        for out in outputs:
            api = owners.get(out.request_id)
            if api is None:  # aborted while the step ran
                continue
            if out.finished:
                api.finished.append(out)
                del owners[out.request_id]
            else:
                api.progress.append(
                    (out.request_id, out.new_token_ids, out.new_text, out.new_logprobs)
                )
        engine = self.engine
        snapshot = EngineSnapshot(
            num_running=engine.num_running,
            num_waiting=engine.num_waiting,
            kv_usage=engine.utilization(),
            preemptions=engine.scheduler.preemptions,
            prompt_tokens=engine.num_prompt_tokens,
            generation_tokens=engine.num_generated_tokens,
            structured_output_errors=engine.num_structured_output_errors,
            speculation=replace(engine.scheduler.speculation),  # a copy: it changes
        )
        for api in self.apis:
            api.outbox.send(StepEvents(api.progress, api.finished, snapshot))
            api.progress, api.finished = [], []
        if self.calls:
            self._answer_calls()


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
