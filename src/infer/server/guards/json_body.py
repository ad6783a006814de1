"""Request bodies parsed without holding the API process's event loop.

``json.loads`` runs in C and holds the GIL throughout: a 1.2 MB body of 100,000
``logit_bias`` entries (or 3.5 MB of 100,000 messages) took 50 ms of CPU on the loop, 0.1-0.2 s
of wall time on a loaded 2-core host, and every other request (``/health`` included) waited
for it (``benchmarks/results-by-topic/09-reliability.md``, 9.3). What a body costs to parse
is the number of values in it, which is the sender's choice, so a body larger than
``INLINE_BYTES`` (at most ~40,000 values, a few
milliseconds) is parsed in a thread by ``json``'s own Python scanner, strings still decoded in
C: the scanner runs bytecode, so the thread gives the GIL back every switch interval (5 ms)
and the loop keeps serving. It costs that body several times the CPU of ``json.loads``, in
one thread for the process, so big bodies are parsed one at a time.

The result, and each error (``json.JSONDecodeError`` with its message and position, a
``UnicodeDecodeError``, a ``RecursionError`` for nesting too deep), are ``json.loads``'s.
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import Response

INLINE_BYTES = 128 * 1024

_executor: ThreadPoolExecutor | None = None


class _YieldingDecoder(json.JSONDecoder):
    """``json.JSONDecoder`` with the Python scanner (strings still decoded in C)."""

    def __init__(self) -> None:
        super().__init__()
        self.scan_once = json.scanner.py_make_scanner(self)  # type: ignore[attr-defined]  # untyped


def loads_yielding(body: bytes) -> Any:
    """``json.loads(body)``, in Python bytecode (so that it can be interrupted for the GIL)."""
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    return _YieldingDecoder().decode(text)


async def parse_json(body: bytes) -> Any:
    """``body`` parsed as ``json.loads`` would: at once if small, else off the event loop."""
    if len(body) <= INLINE_BYTES:
        return json.loads(body)
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(1, thread_name_prefix="infer-json-body")
    return await asyncio.get_running_loop().run_in_executor(_executor, loads_yielding, body)


class JSONBodyRequest(Request):
    """A request whose ``json()`` (what FastAPI validates a body model from) is
    ``parse_json``'s."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await parse_json(await self.body())
        return self._json


class JSONBodyRoute(APIRoute):
    """A route whose handler reads its body through ``JSONBodyRequest``."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            response: Response = await handler(JSONBodyRequest(request.scope, request.receive))
            return response

        return handle
