"""The router's FastAPI app: the OpenAI endpoints forwarded to the workers, ``/health``,
``/metrics``, and ``/workers`` to list, add and remove workers while it runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from infer import __version__
from infer.router.metrics import router_metrics
from infer.router.prompt_text import routing_key
from infer.router.proxy import Forward, forward
from infer.router.workers import DEFAULT_HEALTH_INTERVAL_S, DEFAULT_HEALTH_TIMEOUT_S, WorkerPool
from infer.routing import DEFAULT_ROUTING, RoutingSettings
from infer.server.guards.auth import APIKeyMiddleware
from infer.server.guards.body_limit import BodyLimit, too_large
from infer.server.guards.request_limits import DEFAULT_LIMITS
from infer.server.http.errors import APIError, BodyTooLargeError, install_error_handlers

logger = logging.getLogger(__name__)

_GENERATION = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
_LARGE_BODY = 1 << 16  # bytes; a larger body is parsed off the event loop
# Generation may take as long as it takes; reaching a worker, or sending it a body, not.
_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=30.0, pool=None)


def create_router_app(
    workers: list[str],
    api_key: str | None = None,
    settings: RoutingSettings = DEFAULT_ROUTING,
    health_interval: float = DEFAULT_HEALTH_INTERVAL_S,
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT_S,
    max_body_bytes: int = DEFAULT_LIMITS.max_body_bytes,
) -> FastAPI:
    """An app routing among ``workers`` (``infer serve`` base URLs). Its lifespan probes
    them once, then every ``health_interval`` seconds. ``api_key`` guards ``/v1/`` and
    ``/workers``; the client's ``Authorization`` goes on to the workers as it came."""
    client = httpx.AsyncClient(
        timeout=_TIMEOUT, limits=httpx.Limits(max_connections=None, max_keepalive_connections=256)
    )
    pool = WorkerPool(workers, client, settings, health_interval, health_timeout)
    registry = router_metrics(pool)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.probe_all()
        for report in pool.reports():
            if not report.healthy:
                logger.warning("worker %s is not healthy; it joins once a probe passes", report.url)
        poller = asyncio.create_task(pool.poll_forever())
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await client.aclose()

    app = FastAPI(title="infer router", version=__version__, lifespan=lifespan)
    app.state.pool = pool
    install_error_handlers(app)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)  # /workers too
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    async def read_body(raw: Request) -> bytes:
        try:
            return await raw.body()
        except BodyTooLargeError as exc:
            raise APIError(413, too_large(max_body_bytes), param="body") from exc

    async def proxy(raw: Request) -> Response:
        body = await read_body(raw)
        path = raw.url.path
        key = routing_key(path, await _parsed(body)) if path in _GENERATION else ""
        query = raw.url.query
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw.headers.raw]
        request = Forward(raw.method, f"{path}?{query}" if query else path, headers, body)
        return await _unless_client_leaves(raw, forward(pool, request, key))

    for path in _GENERATION:
        app.add_api_route(path, proxy, methods=["POST"])
    app.add_api_route("/v1/models", proxy, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", proxy, methods=["GET"])

    async def health() -> JSONResponse:
        healthy = sum(report.healthy for report in pool.reports())
        if not healthy:
            raise APIError(503, "no healthy worker", "server_error", code="unavailable")
        return JSONResponse({"status": "ok", "healthy_workers": healthy})

    app.add_api_route("/health", health, methods=["GET", "HEAD"])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/workers")
    async def list_workers() -> JSONResponse:
        return JSONResponse({"workers": [asdict(report) for report in pool.reports()]})

    @app.post("/workers")
    async def add_worker(raw: Request) -> JSONResponse:
        """``{"url": ...}``: a worker to route to once it answers its health probe."""
        body = await _parsed(await read_body(raw))
        url = body.get("url") if isinstance(body, dict) else None
        if not isinstance(url, str):
            raise APIError(400, 'url: the body must be {"url": "http://host:port"}', param="url")
        try:
            name = pool.add(url)
        except ValueError as exc:
            raise APIError.bad_request(exc) from exc
        await pool.probe(name)
        return JSONResponse(_report(pool, name), status_code=201)

    @app.delete("/workers")
    async def remove_worker(url: str) -> JSONResponse:
        """``?url=...``: a worker to route to no more (its requests in flight go on)."""
        try:
            name = pool.remove(url)
        except ValueError as exc:
            raise APIError.bad_request(exc) from exc
        except LookupError as exc:
            raise APIError(404, str(exc), "not_found_error", param="url") from exc
        return JSONResponse({"removed": name})

    return app


async def _unless_client_leaves(raw: Request, answer: Awaitable[Response]) -> Response:
    """``answer``, unless the client goes away before the worker has begun to answer (a
    request that is not streamed: all the while it is generated); then the worker's
    connection is closed, which aborts the request there, and the answer is an empty 499."""
    answering = asyncio.ensure_future(answer)
    leaving = asyncio.ensure_future(_client_left(raw))
    try:
        await asyncio.wait({answering, leaving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
        if not answering.done():
            answering.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        return await answering
    return Response(status_code=499)  # nginx's "client closed request", for the log


async def _client_left(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


def _report(pool: WorkerPool, url: str) -> dict[str, Any]:
    return next(asdict(r) for r in pool.reports() if r.url == url)


async def _parsed(body: bytes) -> Any:
    """The JSON of ``body``, or None if it is none."""

    def parse() -> Any:
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            return None

    if len(body) > _LARGE_BODY:
        return await anyio.to_thread.run_sync(parse)
    return parse()
