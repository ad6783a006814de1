"""``--max-body-bytes`` in front of everything that buffers a body: an announced length over
it is refused before the body is read, a chunked body the moment it passes it; either is a
413 naming ``body``, and the connection closes (the rest is never read). Once large bodies
are done, their memory is given back."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send
from tests.unit.server.guards.conftest import Serve, closed_by_server
from tests.unit.server.guards.test_auth import ReadingApp

from infer.server.guards import body_limit
from infer.server.guards.body_limit import LARGE_BODY_BYTES, BodyLimit
from infer.server.guards.concurrency import ConcurrencyLimit
from infer.server.guards.in_flight import InFlight

LIMIT = 1000


def _app(app: ReadingApp) -> BodyLimit:
    """As ``create_app`` stacks them: the bound before the concurrency, which buffers."""
    return BodyLimit(ConcurrencyLimit(app, 8, InFlight(), exempt=frozenset()), LIMIT)


def test_a_body_within_the_limit_is_read(serve: Serve) -> None:
    with serve(_app(ReadingApp())) as (host, port):
        assert httpx.post(f"http://{host}:{port}/", content=b"x" * LIMIT).text == str(LIMIT)


def test_an_announced_length_over_the_limit_is_a_413_before_the_body(serve: Serve) -> None:
    app = ReadingApp()
    with serve(_app(app)) as address, socket.create_connection(address) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 536870912\r\n\r\n")
        conn.settimeout(5)
        answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer
        assert b'"param":"body"' in answer and b"(--max-body-bytes)" in answer
        assert closed_by_server(conn, within=5)
    assert app.bodies_read == 0


def test_a_chunked_body_is_cut_off_the_moment_it_passes_the_limit(serve: Serve) -> None:
    app = ReadingApp()
    with serve(_app(app)) as address, socket.create_connection(address) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        conn.sendall(b"%x\r\n%s\r\n" % (LIMIT, b"x" * LIMIT))  # at the limit: still read
        conn.settimeout(0.3)
        with contextlib.suppress(TimeoutError):
            assert conn.recv(4096) == b"", "answered within the limit"
        conn.sendall(b"1\r\nx\r\n")  # one byte past it; the body goes on (never ends)
        conn.settimeout(5)
        answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer
        assert b"connection: close" in answer.lower()
        assert closed_by_server(conn, within=5)
    assert app.bodies_read == 0


def test_memory_is_given_back_once_the_last_large_body_is_done(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    given_back: list[float] = []
    monkeypatch.setattr(body_limit, "give_back_memory", lambda: given_back.append(1.0))
    app = BodyLimit(ReadingApp(), 4 * LARGE_BODY_BYTES)
    with serve(app) as (host, port):
        url = f"http://{host}:{port}/"
        assert httpx.post(url, content=b"x" * 1000).is_success
        time.sleep(0.2)
        assert given_back == []  # small bodies leave nothing worth the trim
        assert httpx.post(url, content=b"x" * LARGE_BODY_BYTES).is_success
        deadline = time.monotonic() + 5
        while not given_back and time.monotonic() < deadline:
            time.sleep(0.01)
    assert given_back == [1.0] and app.large_bodies == 0


@pytest.mark.parametrize(
    ("headers", "wrapped"),
    [
        ([(b"content-length", b"12")], False),  # the parser reads no more than announced
        ([(b"transfer-encoding", b"chunked")], True),
        ([(b"content-length", b"12"), (b"transfer-encoding", b"chunked")], True),
    ],
)
def test_only_a_body_of_unknown_length_is_counted_as_it_arrives(
    headers: list[tuple[bytes, bytes]], wrapped: bool
) -> None:
    """A streamed response pays for every wrapper on each chunk it sends: a body whose
    length was announced within the limit gets none."""
    seen: list[tuple[object, object]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((receive, send))

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    scope = {"type": "http", "headers": headers}
    asyncio.run(BodyLimit(app, LIMIT)(scope, receive, send))
    assert (seen[0] != (receive, send)) is wrapped
