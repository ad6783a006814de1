"""Refusal bookkeeping."""

from __future__ import annotations

from infer.kvsim.pool import RefusalLog


def test_only_refusals_with_enough_free_blocks_are_fragmentation() -> None:
    log = RefusalLog()
    log.record(needed=5, free=3)  # plainly out of memory
    assert (log.refused, log.fragmented, log.take_stranded()) == (1, 0, 0)
    log.record(needed=3, free=8)
    log.record(needed=2, free=6)
    assert (log.refused, log.fragmented) == (3, 2)
    assert log.take_stranded() == 8  # the most free blocks seen since the last take
    assert log.take_stranded() == 0
