"""Latency CDFs and throughput over time of one or more results, as one PNG.

Drawn from the result dicts themselves (their ``cdf`` quantiles and ``timeline``), so a plot
can be redrawn from saved JSON, and engines of the same workload share the axes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogFormatter

from infer.bench.table import ENGINE_NAMES

_PANELS = (
    ("ttft_ms", "TTFT (ms)"),
    ("itl_ms", "inter-token latency (ms)"),
    ("e2e_ms", "end-to-end latency (ms)"),
)


def plot_results(records: list[dict[str, Any]], path: Path) -> Path:
    """Write a 2 x 2 figure: TTFT, ITL and E2E CDFs, output tokens/s over time."""
    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    for record in records:
        label = ENGINE_NAMES.get(record["engine"], record["engine"])
        for ax, (key, _) in zip(axes.flat, _PANELS, strict=False):
            quantiles = record["cdf"][key]
            if quantiles:
                fractions = [i / (len(quantiles) - 1) for i in range(len(quantiles))]
                ax.plot(quantiles, fractions, label=label)
        timeline = record["timeline"]
        values = timeline["output_tok_s"]
        times = [(i + 0.5) * timeline["bin_s"] for i in range(len(values))]
        axes.flat[3].plot(times, values, label=label)
    for ax, (key, title) in zip(axes.flat, _PANELS, strict=False):
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of " + ("gaps" if key == "itl_ms" else "requests"))
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[3].set_xlabel("time since first arrival (s)")
    axes.flat[3].set_ylabel("output tokens/s")
    axes.flat[3].grid(True, alpha=0.3)
    for ax in axes.flat:
        ax.legend()
    first = records[0]
    figure.suptitle(f"{first['model']} · {first['workload']} · {first['gpu']}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
