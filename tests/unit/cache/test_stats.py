"""Rates over a stated window: what the counters gained over the last ``window_s`` seconds,
never divided by a shorter interval (a report right after start or after another report
used to divide by almost nothing)."""

from __future__ import annotations

import random

import pytest

from infer.cache.stats import RateWindow

WINDOW_S, RESOLUTION_S = 10.0, 0.1


def test_a_report_soon_after_start_divides_by_the_window() -> None:
    rates = RateWindow(counters=2, window_s=WINDOW_S, now=100.0)
    assert rates.per_second(now=100.0) == (0.0, 0.0)
    rates.record((6, 4), now=100.5)
    assert rates.per_second(now=100.5) == pytest.approx((0.6, 0.4))
    assert rates.per_second(now=100.501) == pytest.approx((0.6, 0.4))  # a second report


def test_only_the_last_window_counts() -> None:
    rates = RateWindow(counters=1, window_s=WINDOW_S, now=100.0)
    rates.record((10,), now=100.05)
    rates.record((30,), now=105.05)
    rates.record((35,), now=112.05)
    # 105.05's tick ends after 115.08 - 10: it counts, over the time since its start.
    assert rates.per_second(now=115.08) == pytest.approx((25 / 10.08,))
    assert rates.per_second(now=115.2) == pytest.approx((5 / 10,))  # since 105.2
    assert rates.per_second(now=130.0) == (0.0,)  # a window without a change


def test_rates_match_the_events_counted_over_each_window() -> None:
    rng = random.Random(42)
    rates = RateWindow(counters=1, window_s=WINDOW_S, resolution_s=RESOLUTION_S, now=0.0)
    events: list[float] = []
    now = 0.0
    for _ in range(2000):
        now += rng.expovariate(20.0) if rng.random() < 0.9 else rng.uniform(0.0, 15.0)
        if rng.random() < 0.8:
            events.append(now)
            rates.record((len(events),), now=now)
        else:
            (rate,) = rates.per_second(now=now)
            # The interval starts 10 to 10.1 s ago, and the rate divides by its length.
            low = counted(events, now - WINDOW_S, now) / (WINDOW_S + RESOLUTION_S)
            high = counted(events, now - WINDOW_S - RESOLUTION_S, now) / WINDOW_S
            assert low - 1e-9 <= rate <= high + 1e-9, (now, rate, low, high)


def counted(events: list[float], since: float, until: float) -> int:
    return sum(1 for at in events if since < at <= until)
