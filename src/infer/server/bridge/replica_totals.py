"""The server's figures over its data-parallel replicas: each replica's (``ReplicaReport``)
and all together, where counters add up, ratios are taken again over the sums (or averaged
where the sums are not known), and settings every replica shares are shown once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infer.contract.messages import EngineSnapshot
from infer.contract.speculation_stats import SpeculationStats

# ``cache_stats`` fields that are each replica's setting, not an amount to add up.
_SHARED_STATS = frozenset(
    {"backend", "block_size", "rate_window_s", "kv_cache_dtype", "kv_bytes_per_token"}
)


@dataclass(frozen=True)
class ReplicaReport:
    """One replica as an API process knows it: whether it serves (``error``: why not), its
    counters after its latest step, and the requests this process routed to it (ever; of
    which for the prefix it was believed to cache)."""

    index: int
    error: str | None
    snapshot: EngineSnapshot
    routed: int = 0
    routed_by_prefix: int = 0

    def status(self) -> dict[str, Any]:
        """How ``/health`` and ``/v1/cache/stats`` name it."""
        if self.error is None:
            return {"replica": self.index, "status": "ok"}
        return {"replica": self.index, "status": "failed", "error": self.error}


def replicas_cache_stats(
    reports: Sequence[ReplicaReport], stats: Sequence[dict[str, Any] | None]
) -> dict[str, Any]:
    """``/v1/cache/stats`` of several replicas: the total of those that serve, then each
    one's (``stats``: in the order of ``reports``; None for one that failed)."""
    served = [s for s in stats if s is not None]
    total = total_cache_stats(served) if served else {}
    each = [{**r.status(), **(s or {})} for r, s in zip(reports, stats, strict=True)]
    return {**total, "replicas": each}


def total_snapshot(snapshots: Sequence[EngineSnapshot]) -> EngineSnapshot:
    """The replicas' counters together; KV use is their mean (each replica's pool is its
    own, sized alike)."""
    if len(snapshots) == 1:
        return snapshots[0]
    if not snapshots:
        return EngineSnapshot()
    return EngineSnapshot(
        num_running=sum(s.num_running for s in snapshots),
        num_waiting=sum(s.num_waiting for s in snapshots),
        kv_usage=sum(s.kv_usage for s in snapshots) / len(snapshots),
        preemptions=sum(s.preemptions for s in snapshots),
        prompt_tokens=sum(s.prompt_tokens for s in snapshots),
        generation_tokens=sum(s.generation_tokens for s in snapshots),
        structured_output_errors=sum(s.structured_output_errors for s in snapshots),
        speculation=total_speculation([s.speculation for s in snapshots]),
    )


def total_speculation(stats: Sequence[SpeculationStats]) -> SpeculationStats:
    longest = max((len(s.accepted_by_position) for s in stats), default=0)
    by_position = [0] * longest
    for s in stats:
        for position, count in enumerate(s.accepted_by_position):
            by_position[position] += count
    return SpeculationStats(
        num_verify_steps=sum(s.num_verify_steps for s in stats),
        num_draft_tokens=sum(s.num_draft_tokens for s in stats),
        num_accepted_tokens=sum(s.num_accepted_tokens for s in stats),
        accepted_by_position=tuple(by_position),
    )


def total_cache_stats(replicas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``/v1/cache/stats`` of several pools as one: amounts added up; utilization, internal
    fragmentation and prefix hit rate taken again over the sums; each replica's settings
    from the first."""
    total: dict[str, Any] = {}
    for name, value in replicas[0].items():
        if name in _SHARED_STATS or not isinstance(value, int | float):
            total[name] = value
        else:
            total[name] = sum(r.get(name, 0) for r in replicas)
    blocks = total.get("num_blocks", 0)
    used = total.get("used_blocks", 0)
    if "utilization" in total:
        total["utilization"] = used / blocks if blocks else 0.0
    if "internal_fragmentation" in total:
        # Each pool's empty slots, from its fragmentation over its used blocks' slots.
        empty = sum(r["internal_fragmentation"] * r["used_blocks"] for r in replicas)
        total["internal_fragmentation"] = empty / used if used else 0.0
    if "prefix_hit_rate" in total:
        queries = total["prefix_queries"]
        total["prefix_hit_rate"] = total["prefix_hits"] / queries if queries else 0.0
    return total
