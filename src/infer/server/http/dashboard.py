"""``GET /dashboard``: the live view of the engine (``infer/dashboard/``), and
``GET /dashboard/stream``: the server-sent events that feed it, one frame each.

While at least one stream is open, one task asks the engine for a view every
``interval_s`` (a ``Call`` the engine answers between two steps) and sends its frame to
every open stream; with none open, nothing is asked, and the engine records nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, StreamingResponse

from infer.contract.engine_view import EngineView
from infer.dashboard.frame import frame
from infer.dashboard.page import render_page
from infer.server.bridge.engine_client import EngineClient
from infer.server.http.sse import dumps

logger = logging.getLogger(__name__)

INTERVAL_S = 0.2  # five frames a second
QUEUED_FRAMES = 8  # a client further behind loses its oldest frames
STREAM_PATH = "/dashboard/stream"


class DashboardFeed:
    """Fans the engine's frames out to the open streams; polls only while one is open."""

    def __init__(self, engine: EngineClient, interval_s: float = INTERVAL_S) -> None:
        self._engine = engine
        self._interval_s = interval_s
        self._queues: set[asyncio.Queue[str | None]] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def watchers(self) -> int:
        return len(self._queues)

    async def events(self) -> AsyncIterator[str]:
        """One open stream: its SSE events until the client leaves or the engine stops."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(QUEUED_FRAMES)
        self._queues.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll())
        try:
            while (data := await queue.get()) is not None:
                yield f"data: {data}\n\n"
        finally:
            self._queues.discard(queue)

    async def _poll(self) -> None:
        engine = self._engine
        try:
            while self._queues and engine.accepting:
                view = await engine.call("dashboard_view")
                data = await asyncio.to_thread(_encode, view)
                for queue in self._queues:
                    _offer(queue, data)
                await asyncio.sleep(self._interval_s)
        except RuntimeError as exc:  # the engine stopped, or cannot give views
            logger.info("the dashboard stream ends: %s", exc)
        finally:
            for queue in self._queues:
                _offer(queue, None)


def _encode(view: EngineView) -> str:
    """The frame as JSON (off the event loop: it deflates the block arrays)."""
    return dumps(frame(view))


def _offer(queue: asyncio.Queue[str | None], item: str | None) -> None:
    """Queue ``item``, dropping the oldest frame when the client is too far behind."""
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(item)


def install_dashboard(app: FastAPI, engine: EngineClient, model_name: str) -> None:
    """Serve the page and its stream (behind ``--api-key`` like the rest: ``guards/auth.py``)."""
    feed = DashboardFeed(engine)
    page = render_page(f"infer · {model_name}", {"live": STREAM_PATH})
    app.state.dashboard = feed

    @app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get(STREAM_PATH, include_in_schema=False)
    async def dashboard_stream() -> StreamingResponse:
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(feed.events(), media_type="text/event-stream", headers=headers)
