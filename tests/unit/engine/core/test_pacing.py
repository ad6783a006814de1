import pytest

from infer.engine.core.pacing import FIRST_LEAD_S, MARGIN_S, LaunchPacer

DECODE = (8, 8)  # 8 tokens, 8 rows
MIXED = (96, 8)


class FakeClock:
    """A clock that only moves when told to, or when the pacer sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _pacer() -> tuple[LaunchPacer, FakeClock]:
    clock = FakeClock()
    return LaunchPacer(clock=clock, sleep=clock.sleep), clock


def _run_steps(
    pacer: LaunchPacer, clock: FakeClock, shape: tuple[int, int], *durations: float
) -> None:
    """Steps of ``shape`` back to back on the device, each queued before the one before it
    ended; the host waits for each one's samples."""
    for duration in durations:
        clock.now += duration
        pacer.collected(shape, waited=True, queued_behind=True)


def test_a_shape_not_seen_yet_is_not_paced() -> None:
    pacer, clock = _pacer()
    pacer.collected(DECODE, waited=True, queued_behind=True)
    assert pacer.wait(DECODE) == 0.0
    assert clock.slept == []


def test_it_sleeps_until_the_step_in_flight_is_due_to_end_less_the_lead() -> None:
    pacer, clock = _pacer()
    pacer.collected(DECODE, waited=True, queued_behind=True)  # the step in flight starts now
    _run_steps(pacer, clock, DECODE, 3.6e-3)
    started = clock.now  # the next decode step starts as the last one ends
    clock.now += 0.5e-3  # the host's bookkeeping
    slept = pacer.wait(DECODE)
    assert clock.now == pytest.approx(started + 3.6e-3 - (FIRST_LEAD_S + MARGIN_S))
    assert slept == clock.slept[0] > 0


def test_the_shortest_recent_duration_is_expected() -> None:
    pacer, clock = _pacer()
    pacer.collected(DECODE, waited=True, queued_behind=True)
    _run_steps(pacer, clock, DECODE, 3.9e-3, 3.6e-3, 4.4e-3)  # a late host makes one look long
    assert pacer.expected_s(DECODE) == pytest.approx(3.6e-3)


def test_durations_are_kept_per_shape() -> None:
    pacer, clock = _pacer()
    pacer.collected(DECODE, waited=True, queued_behind=True)
    _run_steps(pacer, clock, DECODE, 3.6e-3)
    _run_steps(pacer, clock, MIXED, 4.1e-3)
    assert pacer.expected_s(DECODE) == pytest.approx(3.6e-3)
    assert pacer.expected_s(MIXED) == pytest.approx(4.1e-3)
    assert pacer.expected_s((16, 16)) is None


def test_a_host_that_fell_behind_does_not_pace_the_next_step() -> None:
    pacer, clock = _pacer()
    pacer.collected(DECODE, waited=True, queued_behind=True)
    _run_steps(pacer, clock, DECODE, 3.6e-3)
    clock.now += 5e-3
    # The step had ended before the host asked for it: when the next one started is unknown.
    pacer.collected(DECODE, waited=False, queued_behind=True)
    assert pacer.expected_s(DECODE) == pytest.approx(
        3.6e-3
    )  # and that step's duration was not counted
    assert pacer.wait(DECODE) == 0.0


def test_nothing_queued_behind_leaves_no_step_to_pace() -> None:
    pacer, clock = _pacer()
    pacer.collected(DECODE, waited=True, queued_behind=True)
    _run_steps(pacer, clock, DECODE, 3.6e-3)
    clock.now += 3.6e-3
    pacer.collected(DECODE, waited=True, queued_behind=False)  # the batch drained
    clock.now += 1.0
    # A step launched afresh later: its start is not the last collect.
    pacer.collected(DECODE, waited=True, queued_behind=True)
    assert pacer.expected_s(DECODE) == pytest.approx(3.6e-3)


def test_the_lead_is_the_longest_recent_launch_plus_a_margin() -> None:
    pacer, clock = _pacer()
    for launch_s in (0.4e-3, 0.7e-3, 0.5e-3):
        pacer.wait(DECODE)  # not paced: ready at once
        clock.now += launch_s
        pacer.launched()
    assert pacer.lead_s == pytest.approx(0.7e-3 + MARGIN_S)


def test_a_late_wake_up_counts_in_the_lead() -> None:
    pacer, clock = _pacer()
    pacer.collected(DECODE, waited=True, queued_behind=True)
    _run_steps(pacer, clock, DECODE, 3.6e-3)
    planned = clock.now + 3.6e-3 - pacer.lead_s
    pacer.wait(DECODE)
    clock.now += 0.3e-3 + 0.4e-3  # woke 0.3 ms late, then took 0.4 ms to launch
    pacer.launched()
    assert pacer.lead_s == pytest.approx(clock.now - planned + MARGIN_S)


def test_already_late_it_does_not_sleep() -> None:
    pacer, clock = _pacer()
    pacer.collected(DECODE, waited=True, queued_behind=True)
    _run_steps(pacer, clock, DECODE, 3.6e-3)
    clock.now += 3.0e-3  # the host's bookkeeping took most of the step
    assert pacer.wait(DECODE) == 0.0
    assert clock.slept == []
