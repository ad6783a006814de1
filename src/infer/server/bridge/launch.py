"""Running the app under uvicorn, with a graceful shutdown; and running a server in a
background thread or a child process (tests, benchmarks, notebooks).

On SIGINT/SIGTERM uvicorn stops accepting connections and waits for open ones. We also
stop taking new requests (503), give in-flight ones time to finish, then abort the rest:
their streams end with an error event and ``[DONE]``, non-streamed requests get a 503, and
the engine frees their blocks before its process exits. The whole takes at most
``shutdown_timeout`` seconds: requests get all of it but ``stop_reserve`` (what stopping
the engine and exiting take), so a supervisor's deadline of the same length is kept.

If the engine process dies instead (a crash, the OOM killer, ``kill -9``), its pipe closes:
in-flight requests end at once with a 503 saying the engine failed, ``/health`` answers
503, and the server shuts down the same way and exits with status 1, for a supervisor to
restart it. (Nothing could be served meanwhile: the engine's state went with it.) With
several data-parallel replicas, that happens once the last one died: until then a dead
replica's requests end with a 503, and the others serve on (``/health`` says which).

The port is bound when the server is built, before the model loads, so a busy port fails
at once. Idle keep-alive connections live ``timeout_keep_alive`` seconds: longer than
clients keep theirs (httpx: 5 s), so a client never reuses one the server is closing.
Requests in the server are bounded by ``limit_concurrency`` (``guards/concurrency.py``);
connections that have not sent a whole request, by deadlines and counts of their own
(``guards/connections.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from infer.config import EngineConfig
from infer.contract.pipes import EngineLink, replica_links
from infer.server.bridge.api_workers import ApiWorkers, HttpSettings, WorkerSpec
from infer.server.bridge.engine_client import EngineClient
from infer.server.bridge.placement import check_layout
from infer.server.guards.allowed_hosts import default_allowed_hosts, is_loopback
from infer.server.guards.connections import ConnectionLimits, ServerConfig
from infer.server.guards.in_flight import InFlight
from infer.server.guards.request_head import DEFAULT_HEAD_LIMITS, HeadLimits
from infer.server.guards.request_limits import (
    DEFAULT_GRAMMAR_TIMEOUT_S,
    DEFAULT_GRAMMAR_WORKERS,
    DEFAULT_LIMITS,
    RequestLimits,
)
from infer.server.http.api import create_app
from infer.server.http.chat import DEFAULT_CHAT_OPTIONS, ChatOptions
from infer.server.http.metrics import MULTIPROCESS_DIR, shared_between_processes

if TYPE_CHECKING:
    from infer.engine.process import EngineFactory

logger = logging.getLogger(__name__)

# uvicorn cancels what is still open this long after our own abort (a safety net).
_UVICORN_GRACE_S = 5.0
# Of the shutdown timeout, what stopping the engine process and exiting are left (at most
# half of it): benchmarks/results-by-topic/09-reliability.md, 9.4.
_STOP_RESERVE_S = 1.0
DEFAULT_KEEP_ALIVE_S = 30
DEFAULT_HEADER_TIMEOUT_S = 5.0
DEFAULT_REQUEST_READ_TIMEOUT_S = 30.0
DEFAULT_PENDING_CONNECTIONS = 1024
DEFAULT_PENDING_PER_CLIENT = 256
# Requests beyond the engine's capacity: those that never reach it (models, cache stats)
# or are refused by it (a full queue: its own 503).
_SPARE_REQUESTS = 256
_STARTED = re.compile(r"Uvicorn running on (http://\S+:\d+)")


class Server(uvicorn.Server):
    def __init__(
        self,
        config: ServerConfig,
        engine: EngineClient,
        shutdown_timeout: float,
        listener: socket.socket,
        workers: ApiWorkers | None = None,
        on_started: Callable[[], None] | None = None,
    ):
        """``workers``: the API workers the app's lifespan starts (SIGTERMed here when
        shutdown begins); ``on_started``: called once serving, instead of logging that
        uvicorn runs (an API worker tells the process that started it)."""
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self.listener = listener
        self.workers = workers
        self.on_started = on_started
        self.engine_failure: str | None = None
        engine.on_failure = self._engine_failed

    @property
    def exit_code(self) -> int:
        """The process's exit status once ``run`` returned: 1 if the engine failed or the
        server never started, else 0."""
        return 1 if self.engine_failure is not None or not self.started else 0

    def _engine_failed(self, message: str) -> None:
        logger.error("the engine failed; the server stops (exit status 1)")
        self.engine_failure = message
        self.should_exit = True

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve until a signal or ``should_exit``. uvicorn raises the signal that stopped
        it again once it has shut down: SIGTERM then ends ``run`` as SIGINT does, with a
        ``KeyboardInterrupt`` for the caller to suppress, so a graceful stop exits 0 rather
        than by the signal (which a supervisor counts as a failure)."""
        _raise_open_file_limit()
        if threading.current_thread() is threading.main_thread():  # else uvicorn catches none
            signal.signal(signal.SIGTERM, signal.default_int_handler)
        super().run(sockets or [self.listener])

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets is not None:
            if self.on_started is not None:
                self.on_started()
            else:  # uvicorn leaves this to whoever bound the sockets (spawn_server reads it)
                self._log_started_message(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.workers is not None:
            self.workers.terminate()  # they drain while we do
        drain = asyncio.create_task(self.engine.drain(drain_time(self.shutdown_timeout)))
        await super().shutdown(sockets)
        await drain


def drain_time(shutdown_timeout: float) -> float:
    """How long in-flight requests get to finish after a signal (see the module's doc)."""
    return shutdown_timeout - min(_STOP_RESERVE_S, shutdown_timeout / 2)


def build_server(
    engine_config: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    api_key: str | None = None,
    request_timeout: float | None = None,
    shutdown_timeout: float = 10.0,
    log_level: str = "info",
    timeout_keep_alive: int = DEFAULT_KEEP_ALIVE_S,
    limit_concurrency: int | None = None,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
    request_read_timeout: float = DEFAULT_REQUEST_READ_TIMEOUT_S,
    limit_pending_connections: int = DEFAULT_PENDING_CONNECTIONS,
    limit_pending_per_client: int = DEFAULT_PENDING_PER_CLIENT,
    api_server_count: int = 1,
    data_parallel_size: int = 1,
    engine_factory: EngineFactory | None = None,
    chat: ChatOptions = DEFAULT_CHAT_OPTIONS,
    limits: RequestLimits = DEFAULT_LIMITS,
    grammar_workers: int = DEFAULT_GRAMMAR_WORKERS,
    grammar_timeout: float = DEFAULT_GRAMMAR_TIMEOUT_S,
    head: HeadLimits = DEFAULT_HEAD_LIMITS,
    allowed_hosts: Sequence[str] | None = None,
) -> Server:
    """A server for the model of ``engine_config``, its port already bound; ``.run()``
    starts the engine process, serves, and returns after a signal (or ``should_exit``) and a
    graceful shutdown.

    ``limit_concurrency`` bounds the requests in the server, being served or queued (beyond
    it, 503); None: the engines' capacity (``max_batch_size + max_waiting_requests`` per
    replica) plus ``_SPARE_REQUESTS``. A request's headers must arrive within
    ``header_timeout`` seconds, all of it within ``request_read_timeout``;
    ``limit_pending_connections`` and ``limit_pending_per_client`` (one client address)
    bound the connections that have not sent a whole request. ``api_server_count`` API
    processes share the HTTP work (``api_workers.py``); with more than one,
    ``PROMETHEUS_MULTIPROC_DIR`` must name a directory before prometheus_client is imported
    (``infer serve`` sees to it); they count their requests together, and each bounds its
    share of the pending connections.
    ``data_parallel_size`` engine replicas serve the model, each on its own GPUs
    (``bridge/placement.py``), every API process reaching every one; each request goes to
    the replica the cache-aware routing policy picks (``bridge/engine_client.py``).
    ``limits`` bound each request's inputs; ``grammar_workers`` processes (per API process)
    check constraints, each check cut off after ``grammar_timeout`` seconds. ``head`` bounds
    a request's headers (beyond, 431). ``allowed_hosts``: the ``Host`` names answered
    (``guards/allowed_hosts.py``); None: loopback names when ``host`` is a loopback address, else
    any."""
    if not 0 <= port < 65536:
        raise ValueError(f"port: must be in [0, 65535], got {port}")
    if shutdown_timeout < 0:
        raise ValueError(f"shutdown_timeout: must be >= 0 seconds, got {shutdown_timeout}")
    if timeout_keep_alive < 1:
        raise ValueError(f"timeout_keep_alive: must be >= 1 second, got {timeout_keep_alive}")
    if limit_concurrency is not None and limit_concurrency < 1:
        raise ValueError(f"limit_concurrency: must be >= 1, got {limit_concurrency}")
    if header_timeout <= 0:
        raise ValueError(f"header_timeout: must be > 0 seconds, got {header_timeout}")
    if request_read_timeout < header_timeout:
        raise ValueError(
            f"request_read_timeout: must be >= header_timeout ({header_timeout} s), "
            f"got {request_read_timeout}"
        )
    if limit_pending_connections < 1:
        raise ValueError(
            f"limit_pending_connections: must be >= 1, got {limit_pending_connections}"
        )
    if limit_pending_per_client < 1:
        raise ValueError(f"limit_pending_per_client: must be >= 1, got {limit_pending_per_client}")
    if api_server_count < 1:
        raise ValueError(f"api_server_count: must be >= 1, got {api_server_count}")
    check_layout(data_parallel_size, engine_config)
    if api_server_count > 1 and not shared_between_processes():
        raise ValueError(
            f"api_server_count: {api_server_count} API processes need {MULTIPROCESS_DIR} set "
            "(before prometheus_client is imported), so that /metrics adds them up"
        )
    if limit_concurrency is None:
        capacity = engine_config.max_batch_size + engine_config.max_waiting_requests
        limit_concurrency = capacity * data_parallel_size + _SPARE_REQUESTS
    listener = _bind(host, port)
    http = HttpSettings(
        host=host,
        port=listener.getsockname()[1],  # the one bound (port 0: an ephemeral one)
        served_model_name=served_model_name,
        api_key=api_key,
        request_timeout=request_timeout,
        shutdown_timeout=shutdown_timeout,
        log_level=log_level,
        timeout_keep_alive=timeout_keep_alive,
        limit_concurrency=limit_concurrency,
        connections=ConnectionLimits(
            header_timeout=header_timeout,
            request_read_timeout=request_read_timeout,
            pending=-(-limit_pending_connections // api_server_count),
            pending_per_client=-(-limit_pending_per_client // api_server_count),
            head=head,
        ),
        chat=chat,
        limits=limits,
        grammar_workers=grammar_workers,
        grammar_timeout=grammar_timeout,
        allowed_hosts=tuple(allowed_hosts or default_allowed_hosts(host)),
    )
    links = replica_links(data_parallel_size, api_server_count)
    in_flight = InFlight(api_server_count)
    requests = InFlight(api_server_count)
    workers = None
    if api_server_count > 1:
        context = multiprocessing.get_context("spawn")
        specs = [
            WorkerSpec(
                index=i,
                engine_config=engine_config,
                http=http,
                listener=listener,
                links=links[i],
                in_flight=in_flight.of_process(i),
                requests=requests.of_process(i),
                ready=context.RawValue("b", 0),
                engine_factory=engine_factory,
            )
            for i in range(1, api_server_count)
        ]
        workers = ApiWorkers(serve_api_worker, specs, shutdown_timeout + 2 * _UVICORN_GRACE_S)
    server = _server(engine_config, http, listener, links[0], in_flight, requests,
                     engine_factory, workers)  # fmt: skip
    warn_if_open(host, api_key)  # once uvicorn has set up the logging
    return server


def warn_if_open(host: str, api_key: str | None) -> None:
    """A server listening beyond this machine without a key serves anyone who reaches it:
    say so (it may be meant, behind a gateway)."""
    if not api_key and not is_loopback(host):
        logger.warning(
            "listening on %s without --api-key: anyone who can reach this port can use the "
            "server (set --api-key, or bind 127.0.0.1)", host,
        )  # fmt: skip


def _server(
    engine_config: EngineConfig,
    http: HttpSettings,
    listener: socket.socket,
    links: list[EngineLink],
    in_flight: InFlight,
    requests: InFlight,
    engine_factory: EngineFactory | None,
    workers: ApiWorkers | None = None,
    on_started: Callable[[], None] | None = None,
) -> Server:
    """One API process's server (the first, or a worker)."""
    app = create_app(engine_config, http.served_model_name, http.api_key, http.request_timeout,
                     engine_factory, links, in_flight, workers, http.chat, http.limits,
                     http.grammar_workers, http.grammar_timeout, http.limit_concurrency,
                     requests, http.allowed_hosts)  # fmt: skip
    config = ServerConfig(
        app,
        http.connections,
        host=http.host,
        port=http.port,
        log_level=http.log_level,
        timeout_keep_alive=http.timeout_keep_alive,
        timeout_graceful_shutdown=int(http.shutdown_timeout + _UVICORN_GRACE_S),
    )
    return Server(config, app.state.engine, http.shutdown_timeout, listener, workers, on_started)


def serve_api_worker(spec: WorkerSpec) -> None:
    """Entry point of an API worker process: the same server on the listening socket its
    parent bound and handed over, reaching the running engine over its own pipes."""
    server = _server(spec.engine_config, spec.http, spec.listener, spec.links, spec.in_flight,
                     spec.requests, spec.engine_factory, on_started=spec.set_ready)  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):  # how ``run`` ends after SIGINT or SIGTERM
        server.run()
    sys.exit(server.exit_code)


def _raise_open_file_limit() -> None:
    """Let this process open as many files as its hard limit allows: the usual soft limit
    (1,024) is below the connections the default bounds admit, and a server out of file
    descriptors stops accepting connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and hard != resource.RLIM_INFINITY:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _bind(host: str, port: int) -> socket.socket:
    """The server's listening address, bound now (``ValueError`` naming the port when it
    is taken) and listened on once the model is loaded.

    Every API process of the server accepts on this one socket, handed to the workers by
    the process that bound it. Never ``SO_REUSEPORT``: with it, any process of the same
    user could bind the port too and silently take a share of the connections (a second
    ``infer serve`` did); without it, a second server fails here, however many API
    processes either has."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ValueError(f"host: cannot listen on {host!r}: {exc}") from exc
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as exc:
        listener.close()
        raise ValueError(f"port: cannot bind {host}:{port}: {exc.strerror}") from exc
    return listener


@contextmanager
def serve_in_thread(server: Server, startup_timeout: float = 600.0) -> Iterator[str]:
    """Run ``server`` in a background thread (tests, notebooks); yields its base URL.

    Pass ``port=0`` to ``build_server`` for an ephemeral port.
    """
    thread = threading.Thread(target=server.run, name="infer-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join()


@dataclass
class ServerProcess:
    """A server in a child process: its URL, its log so far (stderr), the process."""

    process: subprocess.Popen[str]
    url: str = ""
    log: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def engine_pid(self) -> int:
        """The engine process's pid (Linux): the child running multiprocessing's spawned
        code (the other child is its resource tracker)."""
        pid = self.process.pid
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
        raise RuntimeError("the server has no engine process")

    def tp_worker_pids(self) -> list[int]:
        """The engine's tensor-parallel worker processes' pids (Linux), by rank."""
        engine = self.engine_pid()
        children = Path(f"/proc/{engine}/task/{engine}/children").read_text().split()
        return [
            int(child)
            for child in children
            if b"infer.engine.setup.tp_worker" in Path(f"/proc/{child}/cmdline").read_bytes()
        ]

    def wait(self, timeout: float) -> int:
        """The exit code, once the process has ended and all of its log has been read."""
        code = self.process.wait(timeout)
        if self.reader is not None:
            self.reader.join(timeout)
        return code


@contextmanager
def spawn_server(
    args: Sequence[str],
    startup_timeout: float = 600.0,
    access_log: bool = False,
    subcommand: str = "serve",
) -> Iterator[ServerProcess]:
    """``python -m infer.cli serve ARGS --port 0`` (tests, benchmarks; ``subcommand``:
    another server, ``router``); on exit, if it is still running, it gets SIGTERM (a
    graceful shutdown), then SIGKILL if that takes too long. ``access_log``: its standard
    output (uvicorn's access log) goes into ``log`` too."""
    command = [sys.executable, "-m", "infer.cli", subcommand, *args, "--port", "0"]
    if access_log:  # one pipe, read as the log
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        stream = process.stdout
    else:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        stream = process.stderr
    server = ServerProcess(process)
    started = threading.Event()

    def read_log() -> None:
        assert stream is not None
        for line in stream:
            server.log.append(line)
            match = _STARTED.search(line)
            if match:
                server.url = match.group(1)
                started.set()
        started.set()  # the process ended

    reader = threading.Thread(target=read_log, name="infer-server-log", daemon=True)
    server.reader = reader
    reader.start()
    try:
        if not started.wait(startup_timeout) or not server.url:
            raise RuntimeError("the server did not start:\n" + "".join(server.log[-30:]))
        yield server
    finally:
        process.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            server.wait(timeout=60)
