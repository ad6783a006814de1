"""How soon a thread busy in Python lets a waiting thread have the GIL.

CPython hands the GIL over once a waiting thread has asked for it for 5 ms
(``sys.getswitchinterval()``). The engine's host step and the API process's event loop run
Python for about that long at a stretch, so a thread that needs the GIL only for a moment
waited that long. Grammar masks suffered most: llguidance fills them in Rust with the GIL
released, but the thread that starts and finishes each fill runs Python, so the fill began
only once the engine's thread had finished recording the step and blocked on the masks
(H100, every request of ``burst256`` under a JSON schema: 12.2 ms steps against 8.0 free,
2.7 ms of them waiting for masks that took 3.5 ms to fill; with the GIL handed over every
0.5 ms, 0.01 ms of waiting and 9.1 ms steps).
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
