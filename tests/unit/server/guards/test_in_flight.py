"""The count of unfinished sequences that the server's API processes share."""

from __future__ import annotations

import multiprocessing

from infer.server.guards.in_flight import InFlight


def _take(in_flight: InFlight, count: int) -> None:
    in_flight.add(count)


def test_every_process_sees_the_sum_and_writes_only_its_own_count() -> None:
    first = InFlight(processes=3)
    first.add(5)
    context = multiprocessing.get_context("spawn")
    worker = context.Process(target=_take, args=(first.of_process(2), 7))
    worker.start()
    worker.join(60)
    assert worker.exitcode == 0
    assert first.total == 12 and list(first.counts) == [5, 0, 7]
    first.add(-5)
    assert first.total == 7
    first.forget(2)  # that process ended: its sequences are gone with it
    assert first.total == 0
