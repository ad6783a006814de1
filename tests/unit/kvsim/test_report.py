"""Table, JSON and plots of simulation results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer.config import EngineConfig
from infer.kvsim.footprint import load_footprint
from infer.kvsim.report import format_table, plot, to_json
from infer.kvsim.simulator import StrategyResult, simulate
from infer.kvsim.trace import make_trace


@pytest.fixture
def results(memory_only: EngineConfig) -> list[StrategyResult]:
    trace = make_trace("shared-prefix", num_requests=12)
    footprint = load_footprint("gemma-3-1b")
    return [
        simulate(trace, name, footprint, 64 << 20, memory_only)
        for name in ("naive", "paged", "paged+prefix", "paged+window")
    ]


def test_table_has_a_column_per_strategy(results: list[StrategyResult]) -> None:
    lines = format_table(results).splitlines()
    assert lines[0].split() == ["naive", "paged", "paged+prefix", "paged+window"]
    labels = [line[:28].strip() for line in lines[1:]]
    for label in (
        "peak utilisation",
        "internal fragmentation",
        "external fragmentation",
        "max concurrent sequences",
        "requests refused",
        "requests delayed",
        "prefix blocks shared",
    ):
        assert label in labels
    naive_max = next(line for line in lines if line.startswith("max concurrent"))
    assert naive_max.split()[-4] == str(results[0].max_concurrent_sequences)


def test_json_is_one_object_per_strategy(results: list[StrategyResult]) -> None:
    rows = json.loads(to_json(results))
    assert [row["strategy"] for row in rows] == [r.strategy for r in results]
    assert rows[2]["prefix_blocks_shared"] == results[2].prefix_blocks_shared > 0
    assert rows[0]["peak_utilization"] == results[0].peak_utilization


def test_plots_are_written(results: list[StrategyResult], tmp_path: Path) -> None:
    paths = plot(results, tmp_path / "plots", "test")
    assert [p.name for p in paths] == ["kvsim_memory.png", "kvsim_concurrency.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
