"""Forwarding one request to a worker and its answer back, unchanged.

The body goes as it came; the answer comes back with the worker's status, headers and
bytes, streamed as they arrive. Server-Sent Events are passed on whole events at a time
(the bytes up to the last blank line received), so that a stream cut short never leaves a
client half an event; its end then says what happened, as ``infer serve``'s own streams do
when they fail: an error event (and ``[DONE]`` outside the Responses API).

A request that cannot reach its worker (the connection refused) reached nothing, so it is
routed again, to another worker. Once a worker has it, a failure is the client's: a 503
with an OpenAI-style error if no answer had begun, else the end of the stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from infer.router.workers import WorkerPool
from infer.routing import NoWorkerError, RoutingKey
from infer.server.http.errors import APIError

logger = logging.getLogger(__name__)

# Headers of one connection, not of the message (RFC 9110 7.6.1), and those the HTTP
# stack on the far side writes itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "date",
        "server",
    }
)
_EVENT_END = b"\n\n"


@dataclass(frozen=True)
class Forward:
    """A request to pass on: method, path (with its query string), headers and body."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes


def _passed_on(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]


def worker_failed(url: str) -> APIError:
    return APIError(
        503, f"the worker serving the request ({url}) failed", "server_error", code="unavailable"
    )


def no_worker() -> APIError:
    return APIError(
        503, "no healthy worker to serve the request", "server_error", code="unavailable"
    )


async def forward(pool: WorkerPool, request: Forward, key: RoutingKey) -> Response:
    """Route ``request`` by ``key`` and relay the worker's answer (``APIError`` 503 when no
    worker is healthy or the chosen one fails before answering)."""
    while True:  # each pass takes an unreachable worker out of rotation
        try:
            route = pool.policy.choose(key)
        except NoWorkerError as exc:
            raise no_worker() from exc
        url = route.worker
        upstream_request = pool.client.build_request(
            request.method,
            url + request.path,
            headers=_passed_on(request.headers),
            content=request.body,
        )
        try:
            upstream = await pool.client.send(upstream_request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            pool.policy.finish(url)
            pool.failed(url, unreachable=True)
            continue
        except httpx.HTTPError as exc:
            pool.policy.finish(url)
            pool.failed(url, unreachable=not isinstance(exc, httpx.TimeoutException))
            logger.warning("worker %s failed a request: %r", url, exc)
            raise worker_failed(url) from exc
        except BaseException:
            pool.policy.finish(url)
            raise
        break
    if upstream.status_code >= 500:
        pool.failed(url, unreachable=False)
    return _Relayed(pool, url, upstream, request.path)


class _Relayed(StreamingResponse):
    """A worker's answer, relayed; however it ends (the client may go away while the body
    waits for the worker, and then the body is never resumed), the request is finished and
    the worker's connection closed, which aborts what the worker still does for it."""

    def __init__(self, pool: WorkerPool, url: str, upstream: httpx.Response, path: str) -> None:
        events = upstream.headers.get("content-type", "").startswith("text/event-stream")
        super().__init__(
            _relay(pool, url, upstream, path, events=events),
            status_code=upstream.status_code,
        )
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in _passed_on(upstream.headers.multi_items())
        ]
        self._end = (pool, url, upstream)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            pool, url, upstream = self._end
            pool.policy.finish(url)
            with anyio.CancelScope(shield=True):
                await upstream.aclose()


async def _relay(
    pool: WorkerPool, url: str, upstream: httpx.Response, path: str, *, events: bool
) -> AsyncIterator[bytes]:
    pending = b""
    try:
        async for chunk in upstream.aiter_raw():
            if not events:
                yield chunk
                continue
            pending += chunk
            cut = pending.rfind(_EVENT_END)
            if cut >= 0:
                whole, pending = pending[: cut + len(_EVENT_END)], pending[cut + len(_EVENT_END) :]
                yield whole
        if pending:
            yield pending
    except httpx.HTTPError as exc:
        pool.failed(url, unreachable=not isinstance(exc, httpx.TimeoutException))
        logger.warning("worker %s failed a streamed request: %r", url, exc)
        if events:
            yield error_events(path, worker_failed(url))


def error_events(path: str, error: APIError) -> bytes:
    """The end of a stream that failed: what ``infer serve`` sends in its place."""
    if path.startswith("/v1/responses"):
        info = error.info
        body = {"type": "error", "code": info.code, "message": info.message, "param": info.param}
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    return f"data: {error.json()}\n\ndata: [DONE]\n\n".encode()
