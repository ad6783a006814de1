"""A request's head is bounded as its bytes arrive: so many bytes, so many headers, each
over its bound a 431 that closes the connection, before the parser has buffered it (one
endless header line no longer holds the event loop)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from starlette.types import Receive, Scope, Send
from tests.unit.server.guards.conftest import LIMITS, Serve, closed_by_server

from infer.server.guards.connections import ConnectionLimits
from infer.server.guards.request_head import HeadLimits, RequestHead

HEAD = HeadLimits(max_header_bytes=4096, max_headers=10)


def test_the_head_counts_bytes_and_headers_until_its_empty_line() -> None:
    head = RequestHead(HEAD)
    assert head.feed(b"\r\n\r\nGET / HTTP/1.1\r\nHost: t\r") is None  # empty lines skipped
    assert head.size == len(b"GET / HTTP/1.1\r\nHost: t\r") and not head.ended
    assert head.feed(b"\nA: b\r\n\r") is None  # the end arrives in pieces
    assert head.feed(b"\n" + b"x" * 10_000) is None  # the body is not counted
    assert head.ended and head.lines == 4
    head.reset()
    assert head.feed(b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 10 + b"\r\n") is None
    head.reset()
    assert "more than 10 headers" in str(head.feed(b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 11))


def test_an_endless_line_is_refused_at_the_bound_whatever_its_pieces() -> None:
    head = RequestHead(HEAD)
    assert head.feed(b"GET / HTTP/1.1\r\nX: ") is None
    refusal = None
    fed = 0
    while refusal is None:
        refusal = head.feed(b"y" * 100)
        fed += 100
    assert "exceed 4096 bytes" in refusal and fed < 4096 + 100  # by the piece that passed it


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^max_headers: must be >= 1"):
        HeadLimits(max_headers=0)


async def ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _limits() -> ConnectionLimits:
    return ConnectionLimits(LIMITS.header_timeout, LIMITS.request_read_timeout, LIMITS.pending,
                            LIMITS.pending_per_client, head=HEAD)  # fmt: skip


def test_a_head_over_its_bounds_gets_a_431_and_the_connection_closes(serve: Serve) -> None:
    with serve(ok, _limits()) as (host, port):
        url = f"http://{host}:{port}/"
        assert httpx.get(url, headers={"x-big": "a" * 3000}).status_code == 200
        for headers in ({"x-big": "a" * 5000}, {f"x-{i}": "a" for i in range(11)}):
            refused = httpx.get(url, headers=headers)
            assert refused.status_code == 431
            assert refused.json()["error"]["code"] == "request_header_fields_too_large"
            assert refused.headers["connection"] == "close"
        with socket.create_connection((host, port)) as conn:  # a keep-alive connection
            conn.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            conn.settimeout(5)
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")
            conn.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"y" * 5000)  # its next one
            assert conn.recv(4096).startswith(b"HTTP/1.1 431")
            assert closed_by_server(conn, within=5)


def test_one_endless_header_line_does_not_hold_the_server(serve: Serve) -> None:
    with serve(ok, _limits()) as (host, port), socket.create_connection((host, port)) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX: ")
        start = time.monotonic()
        with pytest.raises(OSError):  # refused, then closed under the sender
            while time.monotonic() - start < 5:
                conn.sendall(b"y" * 65536)
        assert time.monotonic() - start < 2
        assert httpx.get(f"http://{host}:{port}/").status_code == 200
