"""A bound on the request body (``--max-body-bytes``), as it arrives: a body that says it
is larger (``Content-Length``) is refused before it is read, one that grows past the bound
while read (chunked) stops being read there. Either is a 413 naming ``body`` and the limit,
and the connection closes after it (the rest of the body is never read).

It sits in front of everything that buffers a body (``concurrency.py`` holds a request
until it has arrived whole), so what the API process holds per request is bounded."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.server.errors import APIError, BodyTooLargeError, refuse_before_body


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
        refusal = APIError(413, too_large(self.limit), param="body")
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limit:
            await refuse_before_body(refusal, scope, receive, send)
            return
        received = 0
        over = started = False

        async def counted() -> Message:
            nonlocal received, over
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                over = True
                raise BodyTooLargeError(too_large(self.limit))
            return message

        async def closing_when_over(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if over:  # the app answered the error itself: the rest stays unread
                    message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        try:
            await self.app(scope, counted, closing_when_over)
        except BodyTooLargeError:
            if started:
                raise
            await refuse_before_body(refusal, scope, receive, send)
