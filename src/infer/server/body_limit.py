"""A bound on the request body (``--max-body-bytes``), as it arrives: a body that says it
is larger (``Content-Length``) is refused before it is read, one that grows past the bound
while read (chunked) stops being read. Either is a 413 naming ``body`` and the limit."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.server.errors import APIError, BodyTooLargeError


def too_large(limit: int) -> str:
    return f"request body: larger than this server's limit of {limit} bytes (--max-body-bytes)"


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limit:
            await APIError(413, too_large(self.limit), param="body").response()(
                scope, receive, send
            )
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise BodyTooLargeError(too_large(self.limit))
            return message

        await self.app(scope, counted, send)
