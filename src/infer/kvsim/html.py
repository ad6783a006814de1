"""``infer kvsim --html FILE``: the dashboard, replayed, for a simulated trace.

A ``Replay`` watches one strategy's simulation as the engine's dashboard watches the engine
(an ``EngineWatch`` on the simulated clock: each step lasts ``step_s``) and keeps its frames;
``write_html`` puts every strategy's frames into the dashboard page, side by side on one
clock. At most ``max_frames`` frames are kept per strategy: beyond that every other frame is
merged into the next (its steps, latencies and preemptions are kept), so a long trace gives a
coarser replay, not a larger file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infer.dashboard.frame import frame
from infer.dashboard.page import render_page
from infer.engine.core.request import Request
from infer.engine.core.scheduler import SampledTokens, Scheduler
from infer.engine.core.step import Step
from infer.engine.core.watch import EngineWatch

MAX_FRAMES = 300
_RECORDS = ("steps", "latencies", "preempted")


class Replay:
    """The frames of one strategy's simulation."""

    def __init__(self, strategy: str, max_frames: int = MAX_FRAMES) -> None:
        self.strategy = strategy
        self.max_frames = max_frames
        self.frames: list[dict[str, Any]] = []
        self._now = 0.0
        self._watch = EngineWatch(lambda: self._now, armed_s=float("inf"))
        self._stride = 1  # steps per frame
        self._since = 0  # steps since the last frame
        # request id → (joined the queue, first token, last token, tokens), simulated seconds
        self._times: dict[str, tuple[float, float | None, float, int]] = {}

    def arrived(self, request: Request, now: float) -> None:
        self._times[request.request_id] = (now, None, now, 0)

    def stepped(
        self,
        scheduled: Step,
        accepted: list[SampledTokens],
        start_s: float,
        step_s: float,
    ) -> None:
        """One simulated step from ``start_s``; its tokens arrive when it ends."""
        self._now = start_s
        self._watch.begin()
        self._watch.launched(scheduled, None)
        self._now = end = start_s + step_s
        self._watch.stepped()
        for token in accepted:
            request = token.request
            arrived, first, _, count = self._times[request.request_id]
            first = end if first is None else first
            self._times[request.request_id] = (arrived, first, end, count + len(token.token_ids))
            if request.is_finished:
                itl = (end - first) / count if count else None
                self._watch.finished(first - arrived, itl)

    def capture(self, scheduler: Scheduler) -> None:
        """After a step: a frame every ``stride`` steps."""
        self._since += 1
        if self._since >= self._stride:
            self._take(scheduler)

    def finish(self, scheduler: Scheduler) -> None:
        """After the last step: a frame for the steps since the last one."""
        if self._since:
            self._take(scheduler)

    def _take(self, scheduler: Scheduler) -> None:
        """A frame; when there are too many, every other one is merged into the next."""
        self._since = 0
        self.frames.append(frame(self._watch.view(scheduler)))
        if len(self.frames) > self.max_frames:
            self.frames = _halve(self.frames)
            self._stride *= 2


def _halve(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every other frame, each merged into the next one kept (the last is always kept)."""
    kept: list[dict[str, Any]] = []
    carried: dict[str, list[Any]] = {name: [] for name in _RECORDS}
    for i, current in enumerate(frames):
        if (len(frames) - 1 - i) % 2:
            for name in _RECORDS:
                carried[name] += current[name]
            continue
        for name in _RECORDS:
            current[name] = carried[name] + current[name]
            carried[name] = []
        kept.append(current)
    return kept


def write_html(path: Path, title: str, replays: list[Replay]) -> None:
    """The dashboard page replaying every strategy's frames, side by side."""
    panels = [{"name": r.strategy, "frames": r.frames} for r in replays]
    path.write_text(render_page(title, {"replay": panels}), encoding="utf-8")
