"""``--api-key``: every ``/v1/`` route needs ``Authorization: Bearer <key>``.

A plain ASGI middleware, so the key is checked before the body is even parsed (a request
without the key gets 401 whatever its body). ``/health`` and ``/metrics`` stay open for
probes and scrapers, as in vLLM. The dashboard needs the key too; a browser opening it
cannot send a header, so there the key may also come as ``?api_key=<key>``. ``also_guard``:
more path prefixes that need the key (the router's ``/workers``).
"""

from __future__ import annotations

import secrets

from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Receive, Scope, Send

from infer.server.errors import APIError


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, also_guard: tuple[str, ...] = ()) -> None:
        self.app = app
        self._key = api_key.encode()
        self._also_guard = also_guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        dashboard = path == "/dashboard" or path.startswith("/dashboard/")
        if path.startswith("/v1/") or dashboard or path.startswith(self._also_guard):
            authorization = Headers(scope=scope).get("authorization")
            if authorization is None and dashboard:
                key = QueryParams(scope["query_string"]).get("api_key")
                authorization = None if key is None else f"Bearer {key}"
            error = self._check(authorization)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, authorization: str | None) -> APIError | None:
        if not authorization:
            return _unauthorized("You didn't provide an API key (Authorization: Bearer <key>)")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), self._key):
            return _unauthorized("Incorrect API key provided")
        return None


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, "invalid_request_error", code="invalid_api_key")
