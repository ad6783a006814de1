"""``--limit-concurrency`` counts requests, not connections: idle, incomplete and slow ones
take none of it; requests beyond it get a JSON 503 with ``Retry-After`` until one ends;
the probes are never refused; the count is every API process's."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from starlette.types import Receive, Scope, Send
from tests.unit.server.guards.conftest import Serve

from infer.server.guards.concurrency import ConcurrencyLimit
from infer.server.guards.in_flight import InFlight

LIMIT = 2


class HoldingApp:
    """Answers ``/hold`` once released, anything else at once, after reading the body."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/hold":
            self.held += 1
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d bytes" % len(body)})


@pytest.fixture
def app() -> Iterator[HoldingApp]:
    app = HoldingApp()
    yield app
    app.release.set()


def limited(app: HoldingApp, requests: InFlight | None = None) -> ConcurrencyLimit:
    return ConcurrencyLimit(app, LIMIT, requests or InFlight(), exempt=frozenset({"/health"}))


def url(address: tuple[str, int], path: str = "/") -> str:
    return f"http://{address[0]}:{address[1]}{path}"


def hold(
    pool: ThreadPoolExecutor, app: HoldingApp, address: tuple[str, int], count: int
) -> list[Future[httpx.Response]]:
    """``count`` requests that stay in the app until released."""
    before = app.held
    held = [pool.submit(httpx.get, url(address, "/hold"), timeout=30) for _ in range(count)]
    while app.held < before + count:
        time.sleep(0.01)
    return held


def test_idle_and_unfinished_connections_take_no_capacity(app: HoldingApp, serve: Serve) -> None:
    with serve(limited(app)) as address:
        idle = [socket.create_connection(address) for _ in range(50)]
        for conn in idle[:10]:
            conn.sendall(b"GET / HTTP/1.1\r\nHost:")  # headers begun
        for conn in idle[10:20]:
            conn.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        for _ in range(2 * LIMIT):
            assert httpx.get(url(address)).status_code == 200
        idle[10].sendall(b"defghij")  # a body finished late is served
        idle[10].settimeout(10)
        assert idle[10].recv(4096).startswith(b"HTTP/1.1 200")


def test_requests_beyond_the_limit_get_a_json_503_until_one_ends(
    app: HoldingApp, serve: Serve
) -> None:
    with serve(limited(app)) as address, ThreadPoolExecutor(4) as pool:
        held = hold(pool, app, address, LIMIT)
        refused = httpx.post(url(address), content=b"a body")
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "too_many_requests"
        assert refused.headers["Retry-After"] == "1"
        assert httpx.get(url(address, "/health")).status_code == 200  # probes pass
        app.release.set()
        assert [f.result().status_code for f in held] == [200] * LIMIT
        assert httpx.post(url(address), content=b"a body").text == "6 bytes"


def test_the_limit_counts_every_api_process(app: HoldingApp, serve: Serve) -> None:
    requests = InFlight(processes=2)
    with serve(limited(app, requests)) as address, ThreadPoolExecutor(4) as pool:
        requests.of_process(1).add(LIMIT - 1)  # another process's request
        held = hold(pool, app, address, 1)
        assert httpx.get(url(address)).status_code == 503
        requests.forget(1)  # that process ended
        assert httpx.get(url(address)).status_code == 200
        app.release.set()
        assert held[0].result().status_code == 200
    assert requests.total == 0
