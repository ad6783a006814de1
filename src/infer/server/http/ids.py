"""Ids the API hands out (responses, tool calls): random hex, cheap to make."""

from __future__ import annotations

import random


def random_hex(digits: int) -> str:
    """An id nobody guesses by chance. Not ``uuid4``: its ``os.urandom`` is a system call,
    which showed in a burst's intake on the event loop."""
    return f"{random.getrandbits(4 * digits):0{digits}x}"
