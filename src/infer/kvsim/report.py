"""The simulator's results for people (a table, PNG plots) and for machines (JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from infer.kvsim.simulator import StrategyResult
from infer.kvsim.units import format_bytes

Row = tuple[str, Callable[[StrategyResult], str]]


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


_ROWS: list[Row] = [
    ("pool blocks", lambda r: f"{r.num_blocks:,}"),
    ("block size", lambda r: format_bytes(r.bytes_per_block)),
    ("peak utilisation", lambda r: _percent(r.peak_utilization)),
    ("mean utilisation", lambda r: _percent(r.mean_utilization)),
    ("internal fragmentation", lambda r: _percent(r.internal_fragmentation)),
    ("external fragmentation", lambda r: _percent(r.external_fragmentation)),
    ("  refusals by fragmentation", lambda r: f"{r.fragmentation_refusals:,}"),
    ("max concurrent sequences", lambda r: f"{r.max_concurrent_sequences:,}"),
    ("mean concurrent sequences", lambda r: f"{r.mean_concurrent_sequences:,.1f}"),
    ("requests finished", lambda r: f"{r.finished:,}/{r.requests:,}"),
    ("requests refused", lambda r: f"{r.refused:,}"),
    ("requests delayed", lambda r: f"{r.delayed:,}"),
    ("  preemptions", lambda r: f"{r.preemptions:,}"),
    ("prefix blocks shared", lambda r: f"{r.prefix_blocks_shared:,}"),
    ("engine steps", lambda r: f"{r.steps:,}"),
    ("simulated time", lambda r: f"{r.duration_s:,.2f} s"),
]


def format_table(results: list[StrategyResult]) -> str:
    """One column per strategy, one row per measurement."""
    header = ["", *(r.strategy for r in results)]
    rows = [header, *([label, *(cell(r) for r in results)] for label, cell in _ROWS)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))]
        ).rstrip()
        for row in rows
    )


def to_json(results: list[StrategyResult]) -> str:
    """A JSON array with one object per strategy (``StrategyResult.as_dict``)."""
    return json.dumps([r.as_dict() for r in results], indent=2)


def plot(results: list[StrategyResult], directory: Path, title: str) -> list[Path]:
    """Write ``kvsim_memory.png`` (KV memory allocated, and holding tokens, over time) and
    ``kvsim_concurrency.png`` (sequences holding cache over time), a line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    memory, (allocated, holding) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    concurrency, sequences = plt.subplots(figsize=(9, 4.5))
    for r in results:
        times = r.timeline.time_s
        allocated.step(
            times, [b / 2**30 for b in r.timeline.memory_bytes], where="post", label=r.strategy
        )
        holding.step(
            times, [b / 2**30 for b in r.timeline.token_bytes], where="post", label=r.strategy
        )
        sequences.step(times, r.timeline.sequences, where="post", label=r.strategy)
    if results:
        budget = results[0].num_blocks * results[0].bytes_per_block / 2**30
        allocated.axhline(budget, color="grey", linestyle=":", label="KV cache budget")
    allocated.set_title(title)
    allocated.set_ylabel("allocated (GiB)")
    holding.set_ylabel("holding tokens (GiB)")
    sequences.set_title(title)
    sequences.set_ylabel("sequences holding cache")
    paths = []
    for figure, axes, name in (
        (memory, (allocated, holding), "kvsim_memory.png"),
        (concurrency, (sequences,), "kvsim_concurrency.png"),
    ):
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend()
        axes[-1].set_xlabel("simulated time (s)")
        figure.tight_layout()
        figure.savefig(directory / name, dpi=120)
        plt.close(figure)
        paths.append(directory / name)
    return paths
