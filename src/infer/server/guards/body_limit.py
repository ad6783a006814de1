"""A bound on the request body (``--max-body-bytes``), as it arrives: a body that says it
is larger (``Content-Length``) is refused before it is read, one that grows past the bound
while read (chunked) stops being read there. Either is a 413 naming ``body`` and the limit,
and the connection closes after it (the rest of the body is never read).

It sits in front of everything that buffers a body (``concurrency.py`` holds a request
until it has arrived whole), so what the API process holds per request is bounded. Once the
last request with a large body has ended, the memory their copies took is given back to
the system (``heap.give_back_memory``, in a thread): the allocator keeps it otherwise."""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.heap import give_back_memory
from infer.server.http.errors import APIError, BodyTooLargeError, refuse_before_body

LARGE_BODY_BYTES = 1024 * 1024  # bodies from this size on are given back when done


def too_large(limit: int) -> str:
    return f"request body: larger than this server's limit of {limit} bytes (--max-body-bytes)"


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.large_bodies = 0  # requests with a large body, until they end
        self._trimming: asyncio.Future[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and b"transfer-encoding" not in headers:
            await self._announced(int(length), scope, receive, send)
        else:
            await self._counted(scope, receive, send)

    async def _announced(self, length: int, scope: Scope, receive: Receive, send: Send) -> None:
        """A body of ``length`` bytes: the HTTP parser reads no more, so within the limit
        the request passes unwrapped (each wrapper would cost every streamed chunk)."""
        if length > self.limit:
            await refuse_before_body(self._refusal(), scope, receive, send)
            return
        if length < LARGE_BODY_BYTES:
            await self.app(scope, receive, send)
            return
        self.large_bodies += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._large_body_done()

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A body of unknown length (chunked): counted as it arrives."""
        received = 0
        over = started = large = False

        async def counted() -> Message:
            nonlocal received, over, large
            message = await receive()
            received += len(message.get("body", b""))
            if received >= LARGE_BODY_BYTES and not large:
                large = True
                self.large_bodies += 1
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
            await refuse_before_body(self._refusal(), scope, receive, send)
        finally:
            if large:
                self._large_body_done()

    def _refusal(self) -> APIError:
        return APIError(413, too_large(self.limit), param="body")

    def _large_body_done(self) -> None:
        self.large_bodies -= 1
        self._trim_when_none_left()

    def _trim_when_none_left(self) -> None:
        if self.large_bodies or (self._trimming is not None and not self._trimming.done()):
            return
        self._trimming = asyncio.get_running_loop().run_in_executor(None, give_back_memory)
