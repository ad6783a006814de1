"""The connections that have not sent a whole request, bounded in number.

A connection is *pending* while it has not sent a whole request: just opened, partway
through one (*incomplete*), or *idle* between two (keep-alive). Such a connection costs
the server a file descriptor and a little memory, nothing else (the capacity counts
requests, see ``concurrency.py``), but without a bound a client could hold any number.
So there are two: ``limit`` pending connections in all, and ``per_client`` from one client
address. A connection that goes over one closes another pending one: the one idle for the
longest, or, with none idle, the one incomplete for the longest (it has wasted the most
of its header or read deadline).

A connection pending for less than ``grace_s`` is never closed for room: a burst of new
connections (a benchmark's, a proxy's) arrives before any of them has been read, and none
of them should pay for the burst. The bounds may be passed for that long.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


class _Queue(Generic[C]):
    """Pending connections, each kind oldest first."""

    def __init__(self) -> None:
        self.idle: OrderedDict[C, float] = OrderedDict()  # connection → pending since
        self.incomplete: OrderedDict[C, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self.idle) + len(self.incomplete)

    def add(self, conn: C, idle: bool, now: float) -> None:
        (self.idle if idle else self.incomplete)[conn] = now

    def remove(self, conn: C) -> None:
        self.idle.pop(conn, None)
        self.incomplete.pop(conn, None)

    def oldest(self, pending_before: float) -> C | None:
        """The one idle for the longest, else the one incomplete for the longest, if it has
        been pending since before ``pending_before``."""
        for kind in (self.idle, self.incomplete):
            for conn, since in kind.items():  # only the first: the oldest
                if since < pending_before:
                    return conn
                break
        return None


class PendingConnections(Generic[C]):
    """The pending connections of one server process, by client address."""

    def __init__(self, limit: int, per_client: int, grace_s: float) -> None:
        """``limit`` and ``per_client``: at least 1 (``build_server`` checks them)."""
        self.limit = limit
        self.per_client = per_client
        self.grace_s = grace_s
        self._all: _Queue[C] = _Queue()
        self._clients: dict[str, _Queue[C]] = {}
        self._client_of: dict[C, str] = {}

    def __len__(self) -> int:
        return len(self._all)

    def add(self, conn: C, client: str, idle: bool, now: float) -> list[C]:
        """``conn`` (from address ``client``) is pending from ``now``; returns the pending
        connections to close to keep within the bounds (they are no longer counted)."""
        self.remove(conn)
        self._all.add(conn, idle, now)
        queue = self._clients.setdefault(client, _Queue())
        queue.add(conn, idle, now)
        self._client_of[conn] = client
        evicted = self._evict(queue, self.per_client, now)
        return evicted + self._evict(self._all, self.limit, now)

    def remove(self, conn: C) -> None:
        """``conn`` is no longer pending (its request is whole, or it closed)."""
        client = self._client_of.pop(conn, None)
        if client is None:
            return
        self._all.remove(conn)
        queue = self._clients[client]
        queue.remove(conn)
        if not queue:
            del self._clients[client]

    def _evict(self, queue: _Queue[C], limit: int, now: float) -> list[C]:
        evicted = []
        while len(queue) > limit:
            victim = queue.oldest(pending_before=now - self.grace_s)
            if victim is None:
                break
            self.remove(victim)
            evicted.append(victim)
        return evicted
