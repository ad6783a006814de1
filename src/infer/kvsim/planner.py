"""Capacity planning: how many sequences fit in a GPU, contiguous versus paged.

Lab 0.3's "Question 2" and Phase 6's capacity table by arithmetic: the weights come off the
GPU's memory first (``gpu_memory_utilization`` of it is usable), the rest holds K/V. A
contiguous (naive) cache reserves ``max_seq_len`` tokens per sequence; a paged one holds a
sequence's tokens rounded up to whole blocks, so at an average length it fits
``max_seq_len / average`` times more, up to block rounding.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from infer.kvsim.footprint import KVFootprint
from infer.kvsim.units import format_bytes


@dataclass(frozen=True)
class CapacityPlan:
    """Sequences that fit and memory they need, for one average sequence length."""

    model: str
    bytes_per_token: int
    weight_bytes: int
    gpu_memory_bytes: int
    kv_memory_bytes: int  # what is left for K/V after the weights
    block_size: int
    max_seq_len: int
    avg_tokens: int
    peak_tokens: int
    users: int
    naive_bytes_per_sequence: int  # a whole max_seq_len reservation
    paged_bytes_per_sequence: int  # avg_tokens rounded up to blocks
    paged_peak_bytes_per_sequence: int  # peak_tokens rounded up to blocks
    naive_max_sequences: int
    paged_max_sequences: int  # every sequence at the average length
    paged_max_sequences_at_peak: int  # every sequence at the peak length
    naive_bytes_for_users: int
    paged_bytes_for_users: int
    naive_utilization: float  # share of reserved memory holding tokens
    paged_utilization: float
    capacity_gain: float | None  # paged / naive sequences; None when naive fits none

    @property
    def naive_fits_users(self) -> bool:
        return self.naive_max_sequences >= self.users

    @property
    def paged_fits_users(self) -> bool:
        return self.paged_max_sequences >= self.users

    def as_dict(self) -> dict[str, object]:
        return {
            **asdict(self),
            "naive_fits_users": self.naive_fits_users,
            "paged_fits_users": self.paged_fits_users,
        }


def plan_capacity(
    footprint: KVFootprint,
    gpu_memory_bytes: int,
    avg_tokens: int,
    users: int,
    *,
    peak_tokens: int | None = None,
    block_size: int = 16,
    max_seq_len: int = 2048,
    gpu_memory_utilization: float = 1.0,
) -> CapacityPlan:
    """Plan for ``users`` sequences of ``avg_tokens`` on average (``peak_tokens`` at most,
    default ``max_seq_len``); ``ValueError`` naming the flag for impossible inputs."""
    peak = max_seq_len if peak_tokens is None else peak_tokens
    _require(block_size >= 1, "block_size", f"must be >= 1, got {block_size}")
    _require(avg_tokens >= 1, "avg_tokens", f"must be >= 1, got {avg_tokens}")
    _require(users >= 1, "users", f"must be >= 1, got {users}")
    _require(peak >= avg_tokens, "peak_tokens", f"{peak} is below avg_tokens {avg_tokens}")
    _require(peak <= max_seq_len, "peak_tokens", f"{peak} exceeds max_seq_len {max_seq_len}")
    _require(
        0.0 < gpu_memory_utilization <= 1.0,
        "gpu_memory_utilization",
        f"must be in (0, 1], got {gpu_memory_utilization}",
    )
    kv_memory = int(gpu_memory_bytes * gpu_memory_utilization) - footprint.weight_bytes
    _require(
        kv_memory > 0,
        "gpu_memory",
        f"{format_bytes(gpu_memory_bytes)} does not even hold the weights "
        f"({format_bytes(footprint.weight_bytes)})",
    )
    per_token = footprint.bytes_per_token

    def paged_bytes(tokens: int) -> int:
        return math.ceil(tokens / block_size) * block_size * per_token

    naive = max_seq_len * per_token
    paged, paged_peak = paged_bytes(avg_tokens), paged_bytes(peak)
    naive_max, paged_max = kv_memory // naive, kv_memory // paged
    return CapacityPlan(
        model=footprint.name,
        bytes_per_token=per_token,
        weight_bytes=footprint.weight_bytes,
        gpu_memory_bytes=gpu_memory_bytes,
        kv_memory_bytes=kv_memory,
        block_size=block_size,
        max_seq_len=max_seq_len,
        avg_tokens=avg_tokens,
        peak_tokens=peak,
        users=users,
        naive_bytes_per_sequence=naive,
        paged_bytes_per_sequence=paged,
        paged_peak_bytes_per_sequence=paged_peak,
        naive_max_sequences=naive_max,
        paged_max_sequences=paged_max,
        paged_max_sequences_at_peak=kv_memory // paged_peak,
        naive_bytes_for_users=users * naive,
        paged_bytes_for_users=users * paged,
        naive_utilization=avg_tokens * per_token / naive,
        paged_utilization=avg_tokens * per_token / paged,
        capacity_gain=paged_max / naive_max if naive_max else None,
    )


def _require(ok: bool, flag: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{flag}: {message}")


def _gain(plan: CapacityPlan) -> str:
    return "-" if plan.capacity_gain is None else f"{plan.capacity_gain:.1f}x"


def format_plan(plan: CapacityPlan) -> str:
    """The plan as Lab 0.3's Question 2 asks it: per-sequence memory, sequences that fit,
    memory for the users, utilisation, and the gain."""
    rows = [
        ("", "naive (contiguous)", f"paged (block {plan.block_size})"),
        (
            "memory per sequence",
            format_bytes(plan.naive_bytes_per_sequence),
            f"{format_bytes(plan.paged_bytes_per_sequence)} "
            f"({format_bytes(plan.paged_peak_bytes_per_sequence)} at peak)",
        ),
        (
            "sequences that fit",
            f"{plan.naive_max_sequences:,}",
            f"{plan.paged_max_sequences:,} ({plan.paged_max_sequences_at_peak:,} all at peak)",
        ),
        (
            f"memory for {plan.users:,} users",
            format_bytes(plan.naive_bytes_for_users),
            format_bytes(plan.paged_bytes_for_users),
        ),
        (f"{plan.users:,} users fit", _yes(plan.naive_fits_users), _yes(plan.paged_fits_users)),
        (
            "memory utilisation",
            f"{100 * plan.naive_utilization:.1f}%",
            f"{100 * plan.paged_utilization:.1f}%",
        ),
        ("capacity gain", "1.0x", _gain(plan)),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    table = "\n".join(
        f"  {a.ljust(widths[0])}  {b.rjust(widths[1])}  {c.rjust(widths[2])}".rstrip()
        for a, b, c in rows
    )
    return "\n".join(
        [
            f"Capacity plan: {plan.model}, {format_bytes(plan.bytes_per_token)} of K/V per token, "
            f"max_seq_len {plan.max_seq_len}, {plan.avg_tokens} tokens on average "
            f"({plan.peak_tokens} at peak)",
            f"  GPU memory {format_bytes(plan.gpu_memory_bytes)} - weights "
            f"{format_bytes(plan.weight_bytes)} = KV cache {format_bytes(plan.kv_memory_bytes)}",
            table,
        ]
    )


def format_sweep(plans: list[CapacityPlan]) -> str:
    """Phase 6's capacity table: sequences that fit per average length, naive vs paged."""
    rows = [("avg tokens", "naive (contiguous)", "paged", "improvement")] + [
        (f"{p.avg_tokens:,}", f"{p.naive_max_sequences:,}", f"{p.paged_max_sequences:,}", _gain(p))
        for p in plans
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    first = plans[0]
    return "\n".join(
        [
            f"Capacity comparison: {first.model}, KV cache {format_bytes(first.kv_memory_bytes)}, "
            f"max_seq_len {first.max_seq_len}, block {first.block_size}",
            *("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows),
        ]
    )


def plans_to_json(plans: list[CapacityPlan]) -> str:
    return json.dumps([p.as_dict() for p in plans], indent=2)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
