"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure.

Validation failures are 400s (FastAPI's default is 422, which OpenAI clients do not
expect), and a ``ValueError`` whose message starts with ``field:`` names that field. A route
the server does not have is a 404 naming it (``/v1/embeddings``: not served by this model). An
unexpected exception is a 500 with a generic message: its details go to the log, never to
the client.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from infer.contract.errors import ContextLengthError
from infer.server.openai.protocol import ErrorInfo, ErrorResponse, unsupported_reason

logger = logging.getLogger(__name__)

_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")


class APIError(Exception):
    """An error the client sees with this status and body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)
        self.headers = headers

    @classmethod
    def bad_request(cls, exc: Exception, default_param: str | None = None) -> APIError:
        """A 400 from a ``ValueError`` (``"field: message"`` names the field; a prompt too
        long for the context has OpenAI's code)."""
        message = str(exc)
        match = _FIELD_PREFIX.match(message)
        code = "context_length_exceeded" if isinstance(exc, ContextLengthError) else None
        return cls(400, message, param=match.group(1) if match else default_param, code=code)

    def json(self) -> str:
        return ErrorResponse(error=self.info).model_dump_json()

    def response(self) -> Response:
        return Response(
            self.json(), self.status, headers=self.headers, media_type="application/json"
        )


def expects_body(scope: Scope) -> bool:
    """Whether the request's headers announce a body (a length above zero, or chunks)."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0 ")):
            return True
    return False


async def refuse_before_body(error: APIError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer ``error`` without reading the request's body; if one is still coming, the
    connection closes after the answer (else the server would go on reading it, to drop
    it, for as long as the client sends)."""
    response = error.response()
    if expects_body(scope):
        response.headers["Connection"] = "close"
    await response(scope, receive, send)


class BodyTooLargeError(ValueError):
    """A body that grew past ``--max-body-bytes`` while read (``guards/body_limit.py``); FastAPI
    reports it as a body it could not parse, which the handlers turn into a 413."""


def internal_server_error() -> APIError:
    """What a client sees of a failure inside the server (the log has the details)."""
    return APIError(500, "internal server error (the server logged the details)", "server_error")


def _validation_error(exc: RequestValidationError) -> APIError:
    """The first pydantic error as a 400 naming the field (``messages.0.content``)."""
    error = exc.errors()[0]
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    if error.get("type") == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", error.get("msg", ""))
        where = f" at character {loc[0]}" if loc and loc[0].isdigit() else ""
        return APIError(400, f"request body: malformed JSON{where}: {detail}", param="body")
    if error.get("type") == "value_error":  # raised by a model validator: "field: message"
        return APIError.bad_request(ValueError(str((error.get("ctx") or {}).get("error", ""))))
    if not loc:
        return APIError(400, f"request body: {error.get('msg')}", param="body")
    param = ".".join(part for part in loc if not _is_union_tag(part)) or None
    reason = error.get("msg")
    if error.get("type") == "extra_forbidden":
        reason = unsupported_reason(loc[-1])
    message = f"{param}: {reason}" if param else str(reason)
    return APIError(400, message, param=param)


def _unreadable_body(exc: StarletteHTTPException) -> APIError | None:
    """FastAPI's "There was an error parsing the body" (a body it could not decode) as a
    400 that says where the body went wrong."""
    cause = exc.__cause__
    if exc.status_code != 400 or cause is None:
        return None
    if isinstance(cause, BodyTooLargeError):
        return APIError(413, str(cause), param="body")
    if isinstance(cause, UnicodeDecodeError):
        reason = f"not UTF-8 at byte {cause.start} ({cause.reason})"
    else:
        reason = f"could not be read: {type(cause).__name__}: {cause}"
    return APIError(400, f"request body: {reason}", param="body")


# OpenAI endpoints a text-generation model does not serve: what a request to one is told.
_NOT_SERVED = {
    "/v1/embeddings": "embeddings are not served by this model (it generates text)",
    "/embeddings": "embeddings are not served by this model (it generates text)",
}
_ROUTES = "/v1/chat/completions, /v1/completions, /v1/responses, /v1/models"


def _route_error(request: Request, exc: StarletteHTTPException) -> APIError | None:
    """A 404 or 405 of the router (no such route, or not with this method) as OpenAI words
    it, naming the route."""
    route = f"{request.method} {request.url.path}"
    headers = dict(exc.headers or {})
    if exc.status_code == 404 and exc.detail == "Not Found":
        why = _NOT_SERVED.get(request.url.path.rstrip("/"), f"no such route (this server "
                                                              f"serves {_ROUTES})")  # fmt: skip
        return APIError(404, f"Invalid URL ({route}): {why}", "not_found_error", headers=headers)
    if exc.status_code == 405 and exc.detail == "Method Not Allowed":
        allowed = headers.get("allow") or headers.get("Allow") or "other methods"
        message = f"Invalid method ({route}): the route takes {allowed}"
        return APIError(405, message, headers=headers)
    return None


def _is_union_tag(part: str) -> bool:
    """pydantic names union members in error locations (``list[int]``, ``str``,
    ``constrained-str``)."""
    return not part.isdigit() and (
        "[" in part or "-" in part or part in {"str", "int", "float", "bool"}
    )


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return exc.response()

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _validation_error(exc).response()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        unreadable = _unreadable_body(exc)
        if unreadable is not None:
            return unreadable.response()
        route = _route_error(request, exc)
        if route is not None:
            return route.response()
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(
            exc.status_code, str(exc.detail), kind, headers=dict(exc.headers or {})
        ).response()

    async def internal_error(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return internal_server_error().response()

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)
