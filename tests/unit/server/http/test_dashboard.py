"""The dashboard feed: asks the engine for views only while a stream is open, gives every
stream each frame, drops a slow client's oldest frames, ends the streams when the engine
stops."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.unit.dashboard.test_frame import view

from infer.server.bridge.engine_client import EngineStoppedError
from infer.server.http.dashboard import DashboardFeed, _offer


class FakeEngine:
    def __init__(self) -> None:
        self.accepting = True
        self.calls = 0
        self.stopped = False
        self.view = view()

    async def call(self, name: str) -> Any:
        assert name == "dashboard_view"
        if self.stopped:
            raise EngineStoppedError("the server is shutting down")
        self.calls += 1
        return self.view


async def _frames(feed: DashboardFeed, count: int) -> list[dict[str, Any]]:
    frames = []
    async for event in feed.events():
        assert event.startswith("data: ") and event.endswith("\n\n")
        frames.append(json.loads(event.removeprefix("data: ")))
        if len(frames) == count:
            break
    return frames


def test_views_are_asked_for_only_while_a_stream_is_open() -> None:
    async def run() -> None:
        engine = FakeEngine()
        feed = DashboardFeed(engine, interval_s=0.01)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert engine.calls == 0
        first, second = await asyncio.gather(_frames(feed, 3), _frames(feed, 3))
        assert first[0]["numBlocks"] == second[0]["numBlocks"] == 8
        await asyncio.sleep(0.05)  # the poller sees no stream left
        calls = engine.calls
        await asyncio.sleep(0.05)
        assert engine.calls == calls and feed.watchers == 0

    asyncio.run(run())


def test_streams_end_when_the_engine_stops() -> None:
    async def run() -> None:
        engine = FakeEngine()
        feed = DashboardFeed(engine, interval_s=0.01)  # type: ignore[arg-type]

        async def stop_soon() -> None:
            await asyncio.sleep(0.05)
            engine.stopped = True

        frames, _ = await asyncio.wait_for(
            asyncio.gather(_frames(feed, 10_000), stop_soon()), timeout=5
        )
        assert 0 < len(frames) < 10_000

    asyncio.run(run())


def test_a_slow_client_loses_its_oldest_frames() -> None:
    queue: asyncio.Queue[str | None] = asyncio.Queue(2)
    for item in ("1", "2", "3", None):
        _offer(queue, item)
    assert [queue.get_nowait(), queue.get_nowait()] == ["3", None]
