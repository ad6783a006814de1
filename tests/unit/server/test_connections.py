"""Connection bounds under a real uvicorn on a tiny app: a silent or trickling client is
closed after the read deadline, keep-alive outlives the client's idle time, and requests
beyond the connection limit get a JSON 503."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from infer.server.connections import ServerConfig

REQUEST = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n"


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


@contextmanager
def serve(**options: Any) -> Iterator[tuple[str, int]]:
    config = ServerConfig(hello, host="127.0.0.1", port=0, lifespan="off", log_level="warning",
                          **options)  # fmt: skip
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


def closed_by_server(conn: socket.socket, within: float) -> bool:
    conn.settimeout(within)
    try:
        return conn.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_silent_or_trickling_connection_is_closed_after_the_read_deadline() -> None:
    with serve(request_read_timeout=0.5, connection_limit=None) as address:
        silent = socket.create_connection(address)
        trickling = socket.create_connection(address)
        start = time.monotonic()
        with pytest.raises(OSError):  # one byte every 0.1 s: never a whole request in time
            for byte in REQUEST * 10:
                trickling.sendall(bytes([byte]))
                time.sleep(0.1)
        assert 0.5 <= time.monotonic() - start < 2.0
        assert closed_by_server(silent, within=1.0)
        prompt = socket.create_connection(address)  # a whole request in time is served
        prompt.sendall(REQUEST)
        assert prompt.recv(1024).startswith(b"HTTP/1.1 200")


def test_idle_time_between_requests_is_keep_alive_not_the_read_deadline() -> None:
    with serve(request_read_timeout=0.5, connection_limit=None, timeout_keep_alive=30) as address:
        conn = socket.create_connection(address)
        for _ in range(2):
            conn.sendall(REQUEST)
            response = b""
            while not response.endswith(b"0\r\n\r\n"):  # the whole chunked response
                response += conn.recv(1024)
            assert response.startswith(b"HTTP/1.1 200")
            time.sleep(1.0)  # longer than the read deadline: still open


def test_requests_beyond_the_connection_limit_get_a_json_503() -> None:
    with serve(request_read_timeout=30.0, connection_limit=2) as address:
        url = f"http://{address[0]}:{address[1]}/"
        holders = [socket.create_connection(address) for _ in range(2)]
        refused = httpx.get(url)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "too_many_connections"
        assert refused.headers["Retry-After"] == "1"
        for holder in holders:
            holder.close()
        deadline = time.monotonic() + 5
        while httpx.get(url).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
