"""One engine process as an API process reaches it: the process itself (when this API
process started it), the two threads on its pipes, the requests queued for it, its latest
counters and whether it still serves. ``EngineClient`` holds one per data-parallel replica.

A sender thread writes commands (so the event loop never blocks on a full pipe); a reader
thread hands every event to the event loop in one ``call_soon_threadsafe``, through the
``ReplicaEvents`` of the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import multiprocessing
import os
import queue
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Protocol

from infer.config import EngineConfig
from infer.contract.messages import (
    Abort,
    AddRequests,
    CallResult,
    Command,
    EngineFailed,
    EngineInfo,
    EngineSnapshot,
    NewRequest,
    Ready,
    StepEvents,
    Stop,
)
from infer.contract.pipes import EngineLink, PipeEnds
from infer.contract.placement import ReplicaPlacement

if TYPE_CHECKING:
    from infer.engine.process import EngineFactory

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
# The engine process's main, named, not imported: the API process never loads the engine
# (torch, the model's code); the engine process imports it (``_engine_main``).
ENGINE_MAIN = "infer.engine.process"


class ReplicaEvents(Protocol):
    """What a replica reports, each called on the event loop."""

    def replica_ready(self, replica: EngineReplica, info: EngineInfo) -> None: ...

    def replica_step(self, replica: EngineReplica, step: StepEvents) -> None: ...

    def replica_call_result(self, result: CallResult) -> None: ...

    def replica_failed(self, replica: EngineReplica, message: str) -> None: ...


class EngineReplica:
    """Replica ``index``'s engine, reached through ``link`` (whose ``engine`` ends, when
    given, make this API process the one that starts it)."""

    def __init__(self, index: int, link: EngineLink, events: ReplicaEvents) -> None:
        self.index = index
        self.name = str(index)  # the routing policy's name for it
        self.snapshot = EngineSnapshot()  # its counters after its latest step
        self.info: EngineInfo | None = None  # once it is ready
        self.error: str | None = None  # why it stopped serving, if it failed
        self.stopping = False  # told to stop: its pipes closing is no failure
        # Not sent yet: flushed by the client, under its lock.
        self.adds: list[NewRequest] = []
        self.aborts: list[str] = []
        self._link = link
        self._attached = link.engine is None  # an API worker: the engine is not our child
        self._link_open = False
        self._events = events
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: BaseProcess | None = None
        self._outbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def start(
        self,
        config: EngineConfig,
        engine_factory: EngineFactory | None,
        placement: ReplicaPlacement | None,
    ) -> None:
        """Start the engine process (if this API process owns it) and the pipe threads;
        ``replica_ready`` follows once its model is loaded."""
        self._loop = asyncio.get_running_loop()
        link = self._link
        if link.engine is not None:
            context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
            suffix = "" if placement is None else f"-{self.index}"
            self._process = context.Process(
                target=_engine_main,
                args=(config, link.engine, engine_factory, placement),
                name=f"infer-engine{suffix}",
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

    @property
    def healthy(self) -> bool:
        """Whether it serves: it has not failed, and its process runs (or, in an API
        worker, its pipes are open)."""
        if self.error is not None:
            return False
        if self._attached:
            return self._link_open and not self.stopping
        process = self._process
        return process is not None and process.is_alive()

    @property
    def open(self) -> bool:
        return self._link_open and not self.stopping

    @property
    def pid(self) -> int | None:
        """Its engine process's id, when this API process started it and it runs."""
        return None if self._process is None else self._process.pid

    def send(self, command: Command) -> None:
        self._outbox.put(command)

    def send_queued(self) -> None:
        """Send the queued adds, then the aborts (an abort may be for one of them); the
        caller holds the lock that guards them."""
        if self.adds:
            self._outbox.put(AddRequests(self.adds))
            self.adds = []
        if self.aborts:
            self._outbox.put(Abort(self.aborts))
            self.aborts = []

    async def stop(self) -> None:
        """Let the engine free its cache and wait for its process (or, in an API worker,
        close our pipes: the engine forgets us then)."""
        self.stopping = True
        if self._attached and self._link_open:
            self._outbox.put(None)
            for thread in self._threads:
                await asyncio.to_thread(thread.join, STOP_TIMEOUT_S)
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
        self._link_open = False

    # --- the pipe threads ------------------------------------------------------------------
    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens any more
            self._loop.call_soon_threadsafe(fn, *args)

    def _send(self, commands: Connection) -> None:
        with commands:
            while (command := self._outbox.get()) is not None:
                try:
                    commands.send(command)
                except OSError:  # the engine process is gone; the receiver reports it
                    return

    def _receive(self, events: Connection) -> None:
        handler = self._events
        with events:
            try:
                while True:
                    match events.recv():
                        case StepEvents() as step:
                            self._post(handler.replica_step, self, step)
                        case CallResult() as result:
                            self._post(handler.replica_call_result, result)
                        case Ready(info):
                            self._post(handler.replica_ready, self, info)
                        case EngineFailed(message):  # the engine process is ending
                            self._post(handler.replica_failed, self, message)
                            return
            except (EOFError, OSError):
                if self.stopping:  # told to stop: ``stop`` waits for the process (two
                    return  # threads waiting for it race, and one may find it "alive")
                if self._process is None:  # an API worker: the engine is not our child
                    self._post(handler.replica_failed, self, "the engine process went away")
                    return
                self._process.join(5.0)
                code = self._process.exitcode
                message = f"the engine process exited (exit code {code})"
                self._post(handler.replica_failed, self, message)


def _engine_main(
    config: EngineConfig,
    links: Sequence[PipeEnds],
    engine_factory: EngineFactory | None,
    placement: ReplicaPlacement | None,
) -> None:
    """The engine process's target: a replica's environment first (torch reads it once),
    then the engine, imported here by module path."""
    if placement is not None:
        os.environ.update(placement.environment())
    importlib.import_module(ENGINE_MAIN).run_engine(config, links, engine_factory, placement)
