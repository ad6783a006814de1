"""The OpenAPI document says what the server does: errors are 400s (never FastAPI's 422)
with the OpenAI error body, 401/404/503 where they happen, ``Retry-After`` on 503s, and
generation endpoints answer JSON or, with ``stream``, Server-Sent Events."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from infer.server.openai.protocol import ErrorResponse

_RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds until the server likely has room",
        "schema": {"type": "integer", "minimum": 1},
    }
}


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description, **extra}


Responses = dict[int | str, dict[str, Any]]
UNAVAILABLE: Responses = {503: _error("starting, shutting down, or the engine failed")}
AUTHENTICATED: Responses = {401: _error("missing or wrong API key (when the server has one)")}
BAD_REQUEST: Responses = {400: _error("an invalid or unsupported field, named by `error.param`")}
NOT_FOUND: Responses = {404: _error("the model is not served here (`error.param` = `model`)")}


def generation_responses(body: type[BaseModel], chunk: type[BaseModel]) -> Responses:
    """What ``/v1/completions`` and ``/v1/chat/completions`` answer."""
    events = f"with `stream`: `data: <{chunk.__name__} JSON>` events, then `data: [DONE]`"
    return {
        200: {
            "model": body,
            "description": f"the whole response; {events}",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **BAD_REQUEST,
        **AUTHENTICATED,
        **NOT_FOUND,
        500: _error("the generation failed inside the server (details only in its log)"),
        503: _error("the queue is full, or the server is not serving", headers=_RETRY_AFTER),
        504: _error("the request ran past the server's --request-timeout"),
    }


def json_body_schema(body: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a route's body as ``body``, for a route that takes
    the body as a plain dict (and validates it itself)."""
    schema = {"schema": body.model_json_schema()}
    return {"requestBody": {"required": True, "content": {"application/json": schema}}}


def install_openapi(app: FastAPI) -> None:
    """Build the document without the 422s FastAPI adds to every route with a body."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = schema.get("components", {}).get("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
