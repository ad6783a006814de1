"""``--limit-concurrency``: at most so many requests in the server at once, being served
or queued, every API process's together; beyond them a JSON 503 with ``Retry-After``.

A request counts from the moment it has arrived whole (headers and body) until its
response has been sent: a connection that is open, idle or still sending its request takes
no part of the capacity (those are bounded by ``connections.py``), so clients that hold
connections without finishing a request cannot lock anyone out. The health and metrics
probes are never refused: a busy server is not a dead one.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.server.guards.in_flight import InFlight
from infer.server.http.errors import APIError


class ConcurrencyLimit:
    """ASGI middleware in front of the routes, behind the key and the body's bound (which
    bound what it buffers: ``http/api.py``): ``requests`` counts what it lets through."""

    def __init__(
        self, app: ASGIApp, limit: int, requests: InFlight, exempt: frozenset[str]
    ) -> None:
        self.app = app
        self.limit = limit
        self.requests = requests
        self.exempt = exempt
        self.refusal = APIError(
            503,
            f"The server is serving as many requests as it takes ({limit}); retry later",
            "server_error",
            code="too_many_requests",
            headers={"Retry-After": "1", "Connection": "close"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        received = await _whole_request(receive)
        if self.requests.total >= self.limit:
            await self.refusal.response()(scope, receive, send)
            return
        self.requests.add(1)
        try:
            await self.app(scope, _replay(received, receive), send)
        finally:
            self.requests.add(-1)


async def _whole_request(receive: Receive) -> list[Message]:
    """The request's body messages, up to its last (or the client's disconnect)."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that gives ``messages`` first (what the app would have read)."""
    pending = list(reversed(messages))

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed
