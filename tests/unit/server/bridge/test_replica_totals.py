"""The server's figures over its replicas: counters add up, ratios are taken again over the
sums, shared settings shown once, and a failed replica reported, not counted."""

from __future__ import annotations

from typing import Any

import pytest

from infer.contract.messages import EngineSnapshot
from infer.contract.speculation_stats import SpeculationStats
from infer.server.bridge.replica_totals import (
    ReplicaReport,
    replicas_cache_stats,
    total_cache_stats,
    total_snapshot,
)


def pool(used: int, fragmentation: float, hits: int, queries: int) -> dict[str, Any]:
    return {
        "backend": "paged", "block_size": 16, "rate_window_s": 10.0, "num_blocks": 100,
        "used_blocks": used, "free_blocks": 100 - used, "utilization": used / 100,
        "internal_fragmentation": fragmentation, "allocs_per_s": 1.5, "prefix_hits": hits,
        "prefix_queries": queries, "prefix_hit_rate": hits / queries if queries else 0.0,
    }  # fmt: skip


def test_snapshots_add_up_and_kv_use_is_the_mean() -> None:
    a = EngineSnapshot(num_running=2, num_waiting=1, kv_usage=0.2, prompt_tokens=10,
                       speculation=SpeculationStats(1, 4, 3, (1, 2)))  # fmt: skip
    b = EngineSnapshot(num_running=3, kv_usage=0.6, generation_tokens=7,
                       speculation=SpeculationStats(2, 4, 1, (1,)))  # fmt: skip
    total = total_snapshot([a, b])
    assert (total.num_running, total.num_waiting) == (5, 1)
    assert total.kv_usage == pytest.approx(0.4)
    assert (total.prompt_tokens, total.generation_tokens) == (10, 7)
    assert total.speculation == SpeculationStats(3, 8, 4, (2, 2))
    assert total_snapshot([a]) is a
    assert total_snapshot([]) == EngineSnapshot()


def test_cache_stats_add_up_and_their_ratios_are_taken_again() -> None:
    total = total_cache_stats([pool(10, 0.5, 30, 40), pool(30, 0.1, 0, 20)])
    assert (total["num_blocks"], total["used_blocks"], total["free_blocks"]) == (200, 40, 160)
    assert total["utilization"] == pytest.approx(0.2)
    assert total["internal_fragmentation"] == pytest.approx((10 * 0.5 + 30 * 0.1) / 40)
    assert total["prefix_hit_rate"] == pytest.approx(30 / 60)  # not the mean of 0.75 and 0
    assert total["allocs_per_s"] == 3.0
    assert (total["backend"], total["block_size"], total["rate_window_s"]) == ("paged", 16, 10.0)


def test_empty_pools_have_no_ratios_to_divide() -> None:
    total = total_cache_stats([pool(0, 0.0, 0, 0), pool(0, 0.0, 0, 0)])
    assert total["utilization"] == total["internal_fragmentation"] == 0.0
    assert total["prefix_hit_rate"] == 0.0


def test_a_failed_replica_is_listed_with_why_and_left_out_of_the_total() -> None:
    reports = [
        ReplicaReport(0, None, EngineSnapshot()),
        ReplicaReport(1, "it exited", EngineSnapshot()),
    ]
    stats = replicas_cache_stats(reports, [pool(10, 0.0, 3, 4), None])
    assert stats["used_blocks"] == 10 and stats["num_blocks"] == 100
    first, second = stats["replicas"]
    assert first["replica"] == 0 and first["status"] == "ok" and first["used_blocks"] == 10
    assert second == {"replica": 1, "status": "failed", "error": "it exited"}
    assert replicas_cache_stats(reports[1:], [None]) == {"replicas": [second]}
