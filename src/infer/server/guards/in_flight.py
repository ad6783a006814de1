"""A count shared by the server's API processes: of unfinished sequences, or of requests.

Each API process bounds what it sends to the engine by one capacity
(``max_batch_size + max_waiting_requests``), and the requests it takes by one
``--limit-concurrency`` (``concurrency.py``), so each count must cover them all. It lives
in shared memory, a slot per process: each process writes only its own slot and reads the
sum, so no lock is taken. Two processes counting at the same moment can overshoot a bound
by what they add then; the bounds are soft ones (the engine's queue has none).
"""

from __future__ import annotations

import multiprocessing
from typing import Any


class InFlight:
    """Sequences submitted and not yet released (or requests taken and not yet answered),
    as one API process (``index``) sees them."""

    def __init__(self, processes: int = 1, index: int = 0, counts: Any = None) -> None:
        # A ``RawArray`` pickles into a spawned process only as a ``Process`` argument.
        self.counts = counts if counts is not None else multiprocessing.RawArray("q", processes)
        self.index = index

    def of_process(self, index: int) -> InFlight:
        """The same counts, as API process ``index`` sees them."""
        return InFlight(index=index, counts=self.counts)

    @property
    def total(self) -> int:
        """Every process's count."""
        return sum(self.counts)

    def add(self, count: int) -> None:
        """This process took ``count`` more (or, negative, released them)."""
        self.counts[self.index] += count

    def forget(self, index: int) -> None:
        """Process ``index`` ended: what it held no longer counts."""
        self.counts[index] = 0
