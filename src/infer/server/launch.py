"""Running the app under uvicorn, with a graceful shutdown; and running a server in a
background thread or a child process (tests, benchmarks, notebooks).

On SIGINT/SIGTERM uvicorn stops accepting connections and waits for open ones. We also
stop taking new requests (503), give in-flight ones ``shutdown_timeout`` seconds to finish,
then abort the rest: their streams end with an error event and ``[DONE]``, non-streamed
requests get a 503, and the engine frees their blocks before its process exits.
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn

from infer.config import EngineConfig
from infer.server.api import create_app
from infer.server.async_engine import AsyncEngine

# uvicorn cancels what is still open this long after our own abort (a safety net).
_UVICORN_GRACE_S = 5.0
_STARTED = re.compile(r"Uvicorn running on (http://\S+:\d+)")


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, shutdown_timeout: float):
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drain = asyncio.create_task(self.engine.drain(self.shutdown_timeout))
        await super().shutdown(sockets)
        await drain


def build_server(
    engine_config: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    api_key: str | None = None,
    request_timeout: float | None = None,
    shutdown_timeout: float = 10.0,
    log_level: str = "info",
) -> Server:
    """A server for the model of ``engine_config``; ``.run()`` starts the engine process,
    serves, and returns after a signal (or ``should_exit``) and a graceful shutdown."""
    if not 0 <= port < 65536:
        raise ValueError(f"port: must be in [0, 65535], got {port}")
    if shutdown_timeout < 0:
        raise ValueError(f"shutdown_timeout: must be >= 0 seconds, got {shutdown_timeout}")
    app = create_app(engine_config, served_model_name, api_key, request_timeout)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=int(shutdown_timeout + _UVICORN_GRACE_S),
    )
    return Server(config, app.state.engine, shutdown_timeout)


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

    def wait(self, timeout: float) -> int:
        """The exit code, once the process has ended and all of its log has been read."""
        code = self.process.wait(timeout)
        if self.reader is not None:
            self.reader.join(timeout)
        return code


@contextmanager
def spawn_server(args: Sequence[str], startup_timeout: float = 600.0) -> Iterator[ServerProcess]:
    """``python -m infer.server ARGS --port 0`` (tests, benchmarks); on exit, if it is still
    running, it gets SIGTERM (a graceful shutdown), then SIGKILL if that takes too long."""
    command = [sys.executable, "-m", "infer.server", *args, "--port", "0"]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    server = ServerProcess(process)
    started = threading.Event()

    def read_log() -> None:
        assert process.stderr is not None
        for line in process.stderr:
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
