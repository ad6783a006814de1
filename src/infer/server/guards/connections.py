"""Bounds on HTTP connections, so idle, slow or surplus clients cannot pile up.

uvicorn's protocol with these additions, none of which touches the capacity (requests, see
``concurrency.py``):

- a header deadline: a request's headers must arrive within ``header_timeout`` seconds of
  its first byte, or of the connection's opening for its first request (so a connection
  that sends nothing lives that long);
- a read deadline: the whole request (body included) within ``request_read_timeout``
  seconds of the same moment. Idle time *between* requests is uvicorn's
  ``timeout_keep_alive``;
- bounds on pending connections, those that have not sent a whole request: so many in all
  and from one client address (``pending_connections.py``), the longest idle closed first;
- bounds on a request's head, its bytes and its headers (``request_head.py``).

Each closes the connection: without an answer, but for a head over its bounds, which gets
a 431. (Logged at debug level: a client that opens thousands would otherwise flood the log.)
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from infer.server.guards.access_log import redact_access_log
from infer.server.guards.pending_connections import PendingConnections
from infer.server.guards.request_head import DEFAULT_HEAD_LIMITS, HeadLimits, RequestHead
from infer.server.http.errors import APIError


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    request_read_timeout: float
    pending: int  # pending connections in all
    pending_per_client: int
    grace_s: float = 1.0  # see ``pending_connections.py``
    head: HeadLimits = DEFAULT_HEAD_LIMITS


class ServerConfig(uvicorn.Config):
    """uvicorn's settings plus our connection bounds (uvicorn's ``limit_concurrency``
    stays unset: it counts open connections, and answers a plain-text 503), and an access
    log without query strings (``access_log.py``)."""

    def __init__(self, app: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, http=BoundedHttpProtocol, **kwargs)
        self.limits = limits
        self.pending: PendingConnections[BoundedHttpProtocol] = PendingConnections(
            limits.pending, limits.pending_per_client, limits.grace_s
        )

    def configure_logging(self) -> None:
        super().configure_logging()
        redact_access_log()


class _State(enum.Enum):
    INCOMPLETE = "incomplete"  # opened, or partway through a request: pending
    IDLE = "idle"  # between requests (keep-alive): pending
    BUSY = "busy"  # a whole request is being answered


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
        self.limits = config.limits
        self.pending = config.pending
        self._state = _State.BUSY  # not pending until the connection is made
        self._in_message = False  # a request has begun and not ended
        self._unanswered = 0  # whole requests without a whole response (pipelining: >1)
        self._request_started = 0.0  # event-loop time
        self._deadline: asyncio.TimerHandle | None = None
        self._head = RequestHead(self.limits.head)

    # --- uvicorn's callbacks ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_request()
        self._become(_State.INCOMPLETE)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.pending.remove(self)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """The server is stopping: a pending connection has no request to finish."""
        if self._state is _State.BUSY:
            super().shutdown()
        elif not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        refusal = self._head.feed(data)
        if refusal is None:
            super().data_received(data)
        elif not self.transport.is_closing():
            self._refuse_head(refusal)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        if self._state is _State.IDLE:
            self._start_request()
            self._become(_State.INCOMPLETE)

    def on_headers_complete(self) -> None:
        if self._state is _State.INCOMPLETE:  # in time: the read deadline follows
            self._set_deadline(
                self._request_started + self.limits.request_read_timeout, "a whole request"
            )
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head.reset()  # what follows is the next request's head
        self._in_message = False
        self._cancel_deadline()
        if not self.cycle.response_complete:
            self._unanswered += 1
            self._become(_State.BUSY)
        elif self._state is _State.INCOMPLETE:  # answered before its body ended
            self._become(_State.IDLE)

    def on_response_complete(self) -> None:
        self._unanswered = max(0, self._unanswered - 1)
        super().on_response_complete()
        if self._unanswered or self.transport.is_closing():
            return
        if not self._in_message:
            self._become(_State.IDLE)
        elif self._state is _State.BUSY:  # the next request began while this one ran
            self._start_request()
            self._become(_State.INCOMPLETE)

    # --- pending connections -----------------------------------------------------------------
    def _become(self, state: _State) -> None:
        if state is self._state:
            return
        self._state = state
        if state is _State.BUSY:
            self.pending.remove(self)
            return
        client = self.client[0] if self.client else ""
        for victim in self.pending.add(self, client, state is _State.IDLE, self.loop.time()):
            self.logger.debug("closing a pending connection for room (%s)", victim._state.value)
            victim.transport.close()

    def _refuse_head(self, reason: str) -> None:
        """A 431 (the connection closes after it): the parser never saw this head, so no
        app answers it. Behind a response still being sent (pipelining), no answer."""
        self.logger.debug("refusing a request head: %s", reason)
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        error = APIError(431, f"{reason} (--max-header-bytes, --max-headers)",
                         code="request_header_fields_too_large")  # fmt: skip
        body = error.json().encode()
        head = [STATUS_LINE[431], b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n"]  # fmt: skip
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    # --- deadlines -----------------------------------------------------------------------------
    def _start_request(self) -> None:
        self._request_started = self.loop.time()
        self._set_deadline(self._request_started + self.limits.header_timeout, "its headers")

    def _set_deadline(self, when: float, what: str) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_at(when, self._timed_out, what)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self, what: str) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.logger.debug("closing a connection that did not send %s in time", what)
            self.transport.close()
