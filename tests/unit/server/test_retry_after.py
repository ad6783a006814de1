"""``Retry-After`` follows how fast sequences have been finishing."""

from __future__ import annotations

from infer.server.retry_after import RetryAfterEstimator


def test_the_wait_is_the_time_for_the_excess_to_finish_at_the_recent_rate() -> None:
    estimator = RetryAfterEstimator(window_s=10.0, max_s=60)
    start = estimator._started
    for second in range(10):
        estimator.record_finished(2, now=start + second)  # 2 sequences a second
    assert estimator.seconds(4, now=start + 10) == 2
    assert estimator.seconds(41, now=start + 10) == 21
    assert estimator.seconds(1, now=start + 10) == 1  # never below a second
    assert estimator.seconds(10_000, now=start + 10) == 60  # nor above the cap


def test_with_nothing_finished_lately_the_wait_is_the_time_watched() -> None:
    estimator = RetryAfterEstimator(window_s=10.0, max_s=60)
    start = estimator._started
    assert estimator.seconds(5, now=start + 0.2) == 1  # just started: no evidence yet
    assert estimator.seconds(5, now=start + 4.5) == 5
    estimator.record_finished(3, now=start + 5)
    assert estimator.seconds(5, now=start + 30) == 10  # that finish left the window
