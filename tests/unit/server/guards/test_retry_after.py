"""``Retry-After`` counts the callers refused before this one, at the recent finish rate."""

from __future__ import annotations

from infer.server.guards.retry_after import RetryAfterEstimator


def _two_a_second() -> tuple[RetryAfterEstimator, float]:
    estimator = RetryAfterEstimator(window_s=10.0, max_s=60)
    start = estimator._started
    for second in range(10):
        estimator.record_finished(2, now=start + second)
    return estimator, start + 10


def test_a_lone_caller_waits_for_its_excess_to_finish_at_the_recent_rate() -> None:
    estimator, now = _two_a_second()
    assert estimator.seconds(4, now=now) == 2


def test_each_caller_refused_waits_behind_those_refused_before_it() -> None:
    estimator, now = _two_a_second()
    waits = [estimator.seconds(1, now=now) for _ in range(20)]
    # one slot every half second: the 20th caller is told 10 s, not 1 s as the first
    assert waits[0] == 1
    assert waits[-1] == 10
    assert waits == sorted(waits)


def test_slots_that_passed_hold_no_one_up() -> None:
    estimator, now = _two_a_second()
    for _ in range(10):
        estimator.seconds(1, now=now)  # booked up to 5 s from now
    for second in range(10, 20):
        estimator.record_finished(2, now=now + second - 10)
    assert estimator.seconds(1, now=now + 10) == 1


def test_the_wait_stays_between_a_second_and_the_cap() -> None:
    estimator, now = _two_a_second()
    assert estimator.seconds(0, now=now) == 1
    assert estimator.seconds(10_000, now=now) == 60
    assert estimator.seconds(1, now=now) == 60  # behind the caller told the most


def test_with_nothing_finished_lately_every_caller_waits_the_time_watched() -> None:
    estimator = RetryAfterEstimator(window_s=10.0, max_s=60)
    start = estimator._started
    assert estimator.seconds(5, now=start + 0.2) == 1  # just started: no evidence yet
    assert estimator.seconds(5, now=start + 4.5) == 5
    assert estimator.seconds(5, now=start + 4.5) == 5  # no slots booked without a rate
    estimator.record_finished(3, now=start + 5)
    assert estimator.seconds(5, now=start + 30) == 10  # that finish left the window
