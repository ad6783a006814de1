"""Connections that hold a server's sockets and never finish a request: *idle* ones send
nothing, *slow* ones send a request's headers one byte a second and never end them. A
connection the server closes is opened again at the next tick, as an attacker who wants to
keep a server's connections would (``benchmarks/reliability_probe.py``, and the stress test
of idle connections).

Plain blocking sockets and one selector in a thread of its own: a thousand connections cost
the client a file descriptor each and a little work a tick.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

# Headers that never end: a slow connection sends the next byte each tick.
_SLOW_REQUEST = b"GET / HTTP/1.1\r\nHost: idle\r\nX-Slow: "
_CONNECT_TIMEOUT_S = 2.0


@dataclass
class IdleCounts:
    opened: int = 0
    closed_by_server: int = 0
    failed_to_connect: int = 0


class IdleConnections:
    """``idle`` silent and ``slow`` trickling connections to ``address``, held open (and
    reopened) from entering the context to leaving it. ``sources`` are the local addresses
    they come from, in turn (loopback ones other than 127.0.0.1 look like other clients)."""

    def __init__(
        self,
        address: tuple[str, int],
        idle: int,
        slow: int,
        sources: Sequence[str] = ("",),
        tick_s: float = 1.0,
    ) -> None:
        self.address = address
        self.idle = idle
        self.slow = slow
        self.sources = list(sources)
        self.tick_s = tick_s
        self.counts = IdleCounts()
        self._selector = selectors.DefaultSelector()
        self._sent: dict[socket.socket, int] = {}  # slow connection → header bytes sent
        self._idle: set[socket.socket] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-connections", daemon=True)
        self._opened_all = threading.Event()

    def __enter__(self) -> IdleConnections:
        self._thread.start()
        self._opened_all.wait()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        for conn in [*self._idle, *self._sent]:
            conn.close()
        self._selector.close()

    @property
    def open(self) -> int:
        return len(self._idle) + len(self._sent)

    def _run(self) -> None:
        while not self._stop.is_set():
            tick = time.monotonic() + self.tick_s
            self._refill()
            self._opened_all.set()
            for conn in list(self._sent):
                self._send_next_byte(conn)
            while (left := tick - time.monotonic()) > 0 and not self._stop.is_set():
                for key, _ in self._selector.select(min(left, 0.1)):
                    self._read(key.fileobj)  # type: ignore[arg-type]

    def _refill(self) -> None:
        missing = ((self.idle - len(self._idle), False), (self.slow - len(self._sent), True))
        for count, slow in missing:
            for _ in range(count):
                if self._stop.is_set():
                    return
                conn = self._connect()
                if conn is None:
                    continue
                self._selector.register(conn, selectors.EVENT_READ)
                if slow:
                    self._sent[conn] = 0
                else:
                    self._idle.add(conn)

    def _connect(self) -> socket.socket | None:
        source = self.sources[self.counts.opened % len(self.sources)]
        try:
            conn = socket.create_connection(
                self.address, timeout=_CONNECT_TIMEOUT_S, source_address=(source, 0)
            )
        except OSError:
            self.counts.failed_to_connect += 1
            return None
        self.counts.opened += 1
        return conn

    def _send_next_byte(self, conn: socket.socket) -> None:
        sent = self._sent[conn]
        byte = _SLOW_REQUEST[sent : sent + 1] or b"a"
        try:
            conn.send(byte)
        except OSError:
            self._closed(conn)
            return
        self._sent[conn] = sent + 1

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if not data:  # anything else (a 408, say) precedes the close
            self._closed(conn)

    def _closed(self, conn: socket.socket) -> None:
        self.counts.closed_by_server += 1
        self._selector.unregister(conn)
        self._idle.discard(conn)
        self._sent.pop(conn, None)
        conn.close()
