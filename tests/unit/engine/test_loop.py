from __future__ import annotations

from collections.abc import Sequence

from infer.engine.core.wakeup import Wakeup
from infer.engine.loop import UpFront, drain, drive


class FakeEngine:
    """Each request needs ``steps`` steps; a step returns the ids it advanced. While
    ``stalled_steps`` lasts, steps find nothing to run."""

    def __init__(self, stalled_steps: int = 0) -> None:
        self.left: dict[str, int] = {}
        self.stalled = False
        self.stalled_steps = stalled_steps
        self.calls: list[str] = []

    def add(self, request_id: str, steps: int) -> None:
        self.left[request_id] = steps

    def has_unfinished_requests(self) -> bool:
        return bool(self.left)

    def wait_to_schedule(self) -> None:
        self.calls.append("wait")

    def step(self) -> list[str]:
        self.calls.append("step")
        if self.stalled_steps:
            self.stalled_steps -= 1
            self.stalled = True
            return []
        self.stalled = False
        advanced = list(self.left)
        for request_id in advanced:
            self.left[request_id] -= 1
            if self.left[request_id] == 0:
                del self.left[request_id]
        return advanced


class Arrivals:
    """Adds one request per ``take_in`` from a list, then stops once the engine is done."""

    def __init__(self, engine: FakeEngine, arrivals: list[str]) -> None:
        self.engine = engine
        self.arrivals = list(arrivals)
        self.idle: list[bool] = []
        self.outputs: list[list[str]] = []

    def may_take_in(self) -> bool:
        return bool(self.arrivals)

    def take_in(self, idle: bool) -> bool:
        self.idle.append(idle)
        if self.arrivals:
            self.engine.add(self.arrivals.pop(0), steps=2)
            return True
        return self.engine.has_unfinished_requests()

    def put_out(self, outputs: Sequence[str]) -> None:
        self.outputs.append(list(outputs))


def test_the_loop_takes_in_steps_and_puts_out_until_the_feed_stops() -> None:
    engine = FakeEngine()
    feed = Arrivals(engine, ["a", "b"])
    drive(engine, feed)
    assert feed.outputs == [["a"], ["a", "b"], ["b"]]
    assert feed.idle == [True, False, False, True]  # before the first, after the last
    assert not engine.has_unfinished_requests()


def test_steps_are_paced_only_while_requests_may_still_come() -> None:
    engine = FakeEngine()
    drive(engine, Arrivals(engine, ["a", "b"]))
    # "b" may still come after the first step; after that, steps are queued at once.
    assert engine.calls == ["step", "wait", "step", "step"]


def test_a_stalled_engine_counts_as_idle() -> None:
    engine = FakeEngine(stalled_steps=2)
    feed = Arrivals(engine, ["a"])
    drive(engine, feed)
    assert feed.idle[:4] == [True, True, True, False]


class CountingWakeup(Wakeup):
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout_s: float | None = None) -> bool:
        self.waits += 1
        return True


def test_up_front_waits_for_the_wakeup_while_stalled_and_ends_when_all_finished() -> None:
    engine = FakeEngine(stalled_steps=3)
    engine.add("a", steps=1)
    wakeup = CountingWakeup()
    feed: UpFront[str] = UpFront(engine, wakeup)
    drive(engine, feed)
    assert wakeup.waits == 3
    assert engine.calls == ["step"] * 4  # never paced: nothing more can come


def test_drain_steps_until_nothing_is_left() -> None:
    engine = FakeEngine()
    engine.add("a", steps=3)
    engine.add("b", steps=1)
    drain(engine)
    assert not engine.has_unfinished_requests()
    assert engine.calls == ["step"] * 3
