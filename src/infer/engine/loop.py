"""The one loop that drives an engine: take in what has come, run a step, hand out what it
produced. ``LLM``, ``infer generate``, the server's engine process and the benchmarks'
driver differ only in their ``Feed``: where requests come from and where outputs go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from infer.engine.core.wakeup import STALL_CHECK_S, Wakeup

Output = TypeVar("Output")
Output_co = TypeVar("Output_co", covariant=True)
Output_contra = TypeVar("Output_contra", contravariant=True)


class SteppedEngine(Protocol[Output_co]):
    """``Engine``, or a peer's engine made to look like it."""

    @property
    def stalled(self) -> bool:
        """The last step found nothing it could run (only requests whose grammars
        compile)."""
        ...

    def has_unfinished_requests(self) -> bool: ...

    def wait_to_schedule(self) -> None:
        """Sleep until the step in flight is about to end, so that requests taken in
        meanwhile join the step queued next (``Engine.wait_to_schedule``)."""
        ...

    def step(self) -> Sequence[Output_co]: ...


class Feed(Protocol[Output_contra]):
    def may_take_in(self) -> bool:
        """Whether requests may still come: then each step waits to be queued until the one
        in flight is about to end, so that they can join it."""
        ...

    def take_in(self, idle: bool) -> bool:
        """Add what has come (requests, commands); while ``idle`` (the engine has nothing it
        can run) first block until something may have. False ends the loop."""
        ...

    def put_out(self, outputs: Sequence[Output_contra]) -> None: ...


def drive(engine: SteppedEngine[Output], feed: Feed[Output]) -> None:
    """Step ``engine`` with what ``feed`` takes in until the feed says to stop."""
    while True:
        busy = engine.has_unfinished_requests()
        if busy and feed.may_take_in():
            engine.wait_to_schedule()
        if not feed.take_in(idle=not busy or engine.stalled):
            return
        if engine.has_unfinished_requests():
            feed.put_out(engine.step())


class UpFront(Generic[Output]):
    """The feed of requests all added before the loop starts: it takes nothing in, waits
    for ``wakeup`` while they wait for their grammars, and ends once every one has finished.
    Outputs are dropped here; a subclass says where they go."""

    def __init__(self, engine: SteppedEngine[Output], wakeup: Wakeup | None = None) -> None:
        self.engine = engine
        self.wakeup = wakeup

    def may_take_in(self) -> bool:
        return False

    def take_in(self, idle: bool) -> bool:
        if not self.engine.has_unfinished_requests():
            return False
        if idle and self.wakeup is not None:  # not in a busy loop
            self.wakeup.wait(STALL_CHECK_S)
        return True

    def put_out(self, outputs: Sequence[Output]) -> None:
        pass


def drain(engine: SteppedEngine[Output]) -> None:
    """Step until every request (and every step in flight) has finished."""
    drive(engine, UpFront(engine))
