"""``hand_over_gil_often``: a waiting thread gets the GIL within half a millisecond, and an
interval set lower elsewhere stays."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from infer.gil import SWITCH_INTERVAL_S, hand_over_gil_often


@pytest.fixture
def restored_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("restored_interval")
def test_the_interval_drops_to_half_a_millisecond_and_never_rises() -> None:
    sys.setswitchinterval(0.005)  # CPython's default
    hand_over_gil_often()
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S, rel=0.02)
    sys.setswitchinterval(0.0001)  # kept in whole microseconds: read back as 9.9e-05
    lower = sys.getswitchinterval()
    hand_over_gil_often()
    assert sys.getswitchinterval() == lower
