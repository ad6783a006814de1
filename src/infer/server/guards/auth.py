"""``--api-key``: every route but the probes needs ``Authorization: Bearer <key>``.

A plain ASGI middleware in front of everything that reads a body (``http/api.py`` orders them),
so the key is checked from the headers alone: a request without it gets its 401 before a
byte of its body is read, and a connection still sending one is closed
(``refuse_before_body``). ``/health``, ``/ping``, ``/version`` and ``/metrics`` stay open
for probes and scrapers, as in vLLM. The pages a browser opens (the dashboard, the API
docs) cannot send a header, so there the key may also come as ``?api_key=<key>`` (the
access log never shows it: ``access_log.py``).
"""

from __future__ import annotations

import secrets

from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Receive, Scope, Send

from infer.server.http.errors import APIError, refuse_before_body

OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})
# Opened in a browser (GET), which sends no header: they take ``?api_key=`` too.
BROWSER_PAGES = frozenset({"/dashboard", "/docs", "/redoc", "/openapi.json"})


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        authorization = Headers(scope=scope).get("authorization")
        if authorization is None and _browser_page(scope):
            key = QueryParams(scope["query_string"]).get("api_key")
            authorization = None if key is None else f"Bearer {key}"
        error = self._check(authorization)
        if error is not None:
            await refuse_before_body(error, scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check(self, authorization: str | None) -> APIError | None:
        if not authorization:
            return _unauthorized("You didn't provide an API key (Authorization: Bearer <key>)")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), self._key):
            return _unauthorized("Incorrect API key provided")
        return None


def _browser_page(scope: Scope) -> bool:
    path: str = scope["path"]
    page = path in BROWSER_PAGES or path.startswith("/dashboard/")
    return page and scope["method"] in ("GET", "HEAD")


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, "invalid_request_error", code="invalid_api_key")
