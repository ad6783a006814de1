"""How soon a thread busy in Python lets a waiting thread have the GIL: CPython's default
switch interval let the engine's busy thread hold back the threads that start grammar mask
fills for a whole step (``benchmarks/results-by-topic/04-structured.md``, 4.2).
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.0005


def hand_over_gil_often() -> None:
    """Let a waiting thread have the GIL within ``SWITCH_INTERVAL_S`` in this process (an
    interval set lower elsewhere stays). Called where a process starts background threads
    that must run beside a busy one."""
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
