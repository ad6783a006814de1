"""API processes beyond the first: several event loops share the HTTP work of the engine
(each of its data-parallel replicas).

One event loop parses, validates and streams every request in turn, so where its host is
slow or its requests heavy, it can fall behind the engine. (On a 16-core H100 host it kept
up with vLLM's client sending 256 requests at once: four processes served that burst no
faster, see ``benchmarks/results-by-topic/02-serving.md``, 2.2, so ``infer serve`` starts
one unless told.)

API workers are whole API processes (the same app, its own tokenizer thread), each
accepting on the one listening socket that the first process (the one that started the
engines) bound and handed over: the port is the server's alone (``launch._bind``). Each
worker talks to every engine over pipes of its own (``contract/pipes.py``); the counts of
unfinished sequences and of requests are shared (``guards/in_flight.py``), so the server's
capacity and ``--limit-concurrency`` stay one bound each.

The first process starts the workers before the model loads (they start up meanwhile),
announces the server only once every worker serves, and on shutdown stops them (each
drains its own requests) before it stops the engine.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from infer.config import EngineConfig
from infer.contract.pipes import EngineLink
from infer.server.guards.connections import ConnectionLimits
from infer.server.guards.in_flight import InFlight
from infer.server.guards.request_limits import RequestLimits
from infer.server.http.chat import ChatOptions

if TYPE_CHECKING:
    from infer.engine.process import EngineFactory

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_WATCH_S = 1.0
_KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class HttpSettings:
    """The HTTP side of ``build_server``'s arguments, as every API process applies them."""

    host: str
    port: int
    served_model_name: str | None
    api_key: str | None
    request_timeout: float | None
    shutdown_timeout: float
    log_level: str
    timeout_keep_alive: int
    limit_concurrency: int  # requests, every API process's together
    connections: ConnectionLimits  # pending ones: each API process's share
    chat: ChatOptions
    limits: RequestLimits  # of each request's inputs
    grammar_workers: int  # each API process's
    grammar_timeout: float
    allowed_hosts: tuple[str, ...]  # ``Host`` names answered


@dataclass(frozen=True)
class WorkerSpec:
    """What an API worker process is started with (pickled into it)."""

    index: int  # 1, 2, ...: 0 is the process that started the engine
    engine_config: EngineConfig
    http: HttpSettings
    listener: socket.socket  # the server's, inherited
    links: list[EngineLink]  # to each replica's engine
    in_flight: InFlight  # sequences
    requests: InFlight  # requests in the server (``guards/concurrency.py``)
    ready: Any  # a shared ``RawValue`` flag, set to 1 once the worker serves
    engine_factory: EngineFactory | None  # None: the model's engine

    def set_ready(self) -> None:
        self.ready.value = 1


WorkerMain = Callable[[WorkerSpec], None]


class ApiWorkers:
    """Starts, watches and stops the API worker processes of one server."""

    def __init__(self, main: WorkerMain, specs: list[WorkerSpec], stop_timeout: float) -> None:
        """``main`` runs in each worker process (a module-level function, so that it
        pickles), with that worker's spec; ``stop`` waits ``stop_timeout`` seconds for them."""
        self._main = main
        self._specs = specs
        self._stop_timeout = stop_timeout
        self._processes: list[BaseProcess] = []
        self._watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        for spec in self._specs:
            process = context.Process(
                target=self._main, args=(spec,), name=f"infer-api-{spec.index}", daemon=True
            )
            process.start()
            for link in spec.links:  # the worker's: closed here, so they read as EOF if it dies
                link.api.close()
            self._processes.append(process)

    async def wait_ready(self) -> None:
        """Return once every worker serves (``RuntimeError`` if one ended first); from then
        on a worker that ends is logged and its sequences no longer count."""
        while not all(spec.ready.value for spec in self._specs):
            for spec, process in zip(self._specs, self._processes):
                if not process.is_alive():
                    raise RuntimeError(
                        f"API worker {spec.index} ended while starting "
                        f"(exit code {process.exitcode})"
                    )
            await asyncio.sleep(_POLL_S)
        self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        alive = set(range(len(self._processes)))
        while alive:
            await asyncio.sleep(_WATCH_S)
            for i in sorted(alive):
                if not self._processes[i].is_alive():
                    alive.discard(i)
                    spec = self._specs[i]
                    logger.error("API worker %d ended (exit code %s); the others go on",
                                 spec.index, self._processes[i].exitcode)  # fmt: skip
                    spec.in_flight.forget(spec.index)
                    spec.requests.forget(spec.index)

    def terminate(self) -> None:
        """SIGTERM every worker: each stops taking requests and drains its own, as a server
        does on SIGTERM."""
        if self._watcher is not None:
            self._watcher.cancel()
        for process in self._processes:
            if process.is_alive():
                process.terminate()

    async def stop(self) -> None:
        """``terminate`` them, wait for them to end, and kill any that outlive the stop
        timeout."""
        self.terminate()
        deadline = time.monotonic() + self._stop_timeout
        for process in self._processes:
            await asyncio.to_thread(process.join, max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.warning("%s did not stop; killing it", process.name)
                process.kill()
                await asyncio.to_thread(process.join, _KILL_GRACE_S)
