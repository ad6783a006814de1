"""Connection bounds under a real uvicorn on a tiny app: header and read deadlines, idle
time between requests left to keep-alive, and the bounds on pending connections (the
longest idle closed first, one client's bound touching only its own, busy connections and
young ones never closed for room)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from starlette.types import Receive, Scope, Send
from tests.unit.server.guards.conftest import Serve, closed_by_server, response

from infer.server.guards.connections import ConnectionLimits

REQUEST = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n"
SETTLE_S = 0.1  # for the server to take in what a socket just did


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, then answers (so the response waits for the request)."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


def limits(**bounds: float) -> ConnectionLimits:
    values = dict(header_timeout=30.0, request_read_timeout=30.0, pending=1000,
                  pending_per_client=1000, grace_s=0.0)  # fmt: skip
    return ConnectionLimits(**{**values, **bounds})  # type: ignore[arg-type]


def connect(address: tuple[str, int], source: str = "127.0.0.1") -> socket.socket:
    conn = socket.create_connection(address, source_address=(source, 0))
    time.sleep(SETTLE_S)  # in the server's books before the next one opens
    return conn


@pytest.mark.serial
def test_headers_must_arrive_within_the_header_timeout(serve: Serve) -> None:
    with serve(hello, limits(header_timeout=0.5)) as address:
        silent = socket.create_connection(address)
        trickling = socket.create_connection(address)
        start = time.monotonic()
        with pytest.raises(OSError):  # one byte every 0.1 s: never whole headers in time
            for byte in REQUEST * 10:
                trickling.sendall(bytes([byte]))
                time.sleep(0.1)
        assert 0.5 <= time.monotonic() - start < 2.0
        assert closed_by_server(silent, within=1.0)
        prompt = socket.create_connection(address)  # a whole request in time is served
        assert response(prompt).startswith(b"HTTP/1.1 200")


@pytest.mark.serial
def test_a_body_must_arrive_within_the_read_timeout(serve: Serve) -> None:
    with serve(hello, limits(header_timeout=0.3, request_read_timeout=1.5)) as address:
        conn = socket.create_connection(address)
        start = time.monotonic()
        conn.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        with pytest.raises(OSError):  # headers in time, then a body byte every 0.1 s
            for _ in range(100):
                time.sleep(0.1)
                conn.sendall(b"x")
        assert 1.5 <= time.monotonic() - start < 3.0


def test_idle_time_between_requests_is_keep_alive_not_a_deadline(serve: Serve) -> None:
    bounds = limits(header_timeout=0.5, request_read_timeout=0.5)
    with serve(hello, bounds, timeout_keep_alive=30) as address:
        conn = socket.create_connection(address)
        for _ in range(2):
            assert response(conn).startswith(b"HTTP/1.1 200")
            time.sleep(1.0)  # longer than the deadlines: still open


def test_a_later_requests_header_deadline_starts_at_its_first_byte(serve: Serve) -> None:
    with serve(hello, limits(header_timeout=0.5), timeout_keep_alive=30) as address:
        conn = socket.create_connection(address)
        assert response(conn).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)
        conn.sendall(REQUEST[:10])
        assert not closed_by_server(conn, within=0.3)
        assert closed_by_server(conn, within=1.0)


def test_beyond_the_pending_bound_the_longest_idle_connection_goes_first(serve: Serve) -> None:
    with serve(hello, limits(pending=3), timeout_keep_alive=30) as address:
        opened = connect(address)
        idle = connect(address)
        assert response(idle).startswith(b"HTTP/1.1 200")
        time.sleep(SETTLE_S)
        opened_later = connect(address)
        newest = connect(address)  # a fourth pending connection: the idle one goes
        assert closed_by_server(idle, within=1.0)
        assert not closed_by_server(opened, within=0.2)
        fifth = connect(address)  # none idle: the one opened first goes
        assert closed_by_server(opened, within=1.0)
        for conn in (opened_later, newest, fifth):
            assert response(conn).startswith(b"HTTP/1.1 200")


def test_one_clients_bound_touches_only_that_clients_connections(serve: Serve) -> None:
    with serve(hello, limits(pending=100, pending_per_client=2)) as address:
        mine = connect(address, "127.0.0.1")
        theirs = [connect(address, "127.0.0.2") for _ in range(3)]
        assert closed_by_server(theirs[0], within=1.0)
        for conn in (mine, *theirs[1:]):
            assert response(conn).startswith(b"HTTP/1.1 200")


def test_a_busy_connection_is_never_closed_for_room(serve: Serve) -> None:
    release = threading.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)
        await hello(scope, receive, send)

    with serve(slow, limits(pending=1)) as address:
        busy = connect(address)
        busy.sendall(REQUEST)
        time.sleep(SETTLE_S)
        first = connect(address)
        connect(address)  # over the bound: the pending one goes, not the busy one
        assert closed_by_server(first, within=1.0)
        release.set()
        busy.settimeout(10)
        assert busy.recv(4096).startswith(b"HTTP/1.1 200")


def test_a_burst_younger_than_the_grace_period_is_served_whole(serve: Serve) -> None:
    bounds = limits(pending=2, pending_per_client=2, grace_s=5.0)
    with serve(hello, bounds) as address:
        burst = [socket.create_connection(address) for _ in range(20)]
        time.sleep(SETTLE_S)
        for conn in burst:
            assert response(conn).startswith(b"HTTP/1.1 200")


@pytest.mark.serial
def test_shutting_down_closes_pending_connections_at_once(serve: Serve) -> None:
    with serve(hello) as address:  # 30 s deadlines
        fresh = socket.create_connection(address)
        unfinished = socket.create_connection(address)
        unfinished.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        time.sleep(SETTLE_S)
        start = time.monotonic()
    assert time.monotonic() - start < 2.0  # not the read deadline
    assert closed_by_server(fresh, within=0.1) and closed_by_server(unfinished, within=0.1)
