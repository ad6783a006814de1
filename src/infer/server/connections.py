"""Bounds on HTTP connections, so idle, slow or surplus clients cannot pile up.

uvicorn's protocol with two additions:

- a read deadline: a connection must deliver each request (headers and body) within
  ``request_read_timeout`` seconds of its first byte, or of opening when it sends nothing,
  else it is closed. Idle time *between* requests is uvicorn's ``timeout_keep_alive``.
- a connection limit: a request that arrives while more than ``limit_concurrency``
  connections are open (or as many requests run) gets the server's JSON 503 with
  ``Retry-After`` and ``Connection: close``, instead of uvicorn's plain-text one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from infer.server.errors import APIError

TOO_MANY_CONNECTIONS = APIError(
    503,
    "The server has too many open connections; retry later",
    "server_error",
    code="too_many_connections",
    headers={"Retry-After": "1", "Connection": "close"},
)


class ServerConfig(uvicorn.Config):
    """uvicorn's settings plus the read deadline and our own connection limit (uvicorn's
    ``limit_concurrency`` stays unset so that its plain-text 503 never fires)."""

    def __init__(
        self,
        app: Any,
        request_read_timeout: float,
        connection_limit: int | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, http=BoundedHttpProtocol, **kwargs)
        self.request_read_timeout = request_read_timeout
        self.connection_limit = connection_limit


async def _too_many_connections(scope: Scope, receive: Receive, send: Send) -> None:
    await TOO_MANY_CONNECTIONS.response()(scope, receive, send)


class BoundedHttpProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        assert isinstance(config, ServerConfig)
        self.read_timeout = config.request_read_timeout
        self.connection_limit = config.connection_limit
        self._read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_read_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_read_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The first bytes of a request start its deadline; its last bytes stop it.
        if self._read_deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._start_read_deadline()
        super().data_received(data)

    def on_message_complete(self) -> None:
        self._stop_read_deadline()
        super().on_message_complete()

    def on_headers_complete(self) -> None:
        if not self._over_limit():
            super().on_headers_complete()
            return
        app, self.app = self.app, _too_many_connections
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def _over_limit(self) -> bool:
        limit = self.connection_limit
        return limit is not None and (len(self.connections) > limit or len(self.tasks) >= limit)

    def _start_read_deadline(self) -> None:
        self._stop_read_deadline()
        self._read_deadline = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _stop_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection that did not send a request in time")
            self.transport.close()
