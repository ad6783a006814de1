"""``serve``: a real uvicorn with our connection bounds, serving a tiny app in a thread (the
connection and concurrency tests)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import uvicorn
from starlette.types import ASGIApp

from infer.server.guards.connections import ConnectionLimits, ServerConfig

Address = tuple[str, int]
Serve = Callable[..., AbstractContextManager[Address]]
LIMITS = ConnectionLimits(
    header_timeout=30.0, request_read_timeout=30.0, pending=1000, pending_per_client=1000
)


@contextmanager
def _serve(app: ASGIApp, limits: ConnectionLimits = LIMITS, **options: Any) -> Iterator[Address]:
    config = ServerConfig(app, limits, host="127.0.0.1", port=0, lifespan="off",
                          log_level="warning", **options)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[:2]
    finally:
        server.should_exit = True
        thread.join()


@pytest.fixture
def serve() -> Serve:
    """``serve(app, limits, **uvicorn_options)``: a context yielding the server's address."""
    return _serve


def closed_by_server(conn: socket.socket, within: float) -> bool:
    """Whether the server closes ``conn`` within ``within`` seconds (whatever it sent
    before)."""
    deadline = time.monotonic() + within
    try:
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if conn.recv(4096) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        pass
    return False


def response(conn: socket.socket, request: bytes = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n") -> bytes:
    """Send ``request`` and read its whole (chunked) response."""
    conn.sendall(request)
    conn.settimeout(10)
    received = b""
    while not received.endswith(b"0\r\n\r\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        received += chunk
    return received
