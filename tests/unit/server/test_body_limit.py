"""``--max-body-bytes`` in front of everything that buffers a body: an announced length over
it is refused before the body is read, a chunked body the moment it passes it; either is a
413 naming ``body``, and the connection closes (the rest is never read)."""

from __future__ import annotations

import contextlib
import socket

import httpx
from tests.unit.server.conftest import Serve, closed_by_server
from tests.unit.server.test_auth import ReadingApp

from infer.server.body_limit import BodyLimit
from infer.server.concurrency import ConcurrencyLimit
from infer.server.in_flight import InFlight

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
