"""The scoreboard: one entry per headline figure, rewritten atomically, others kept."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from infer.bench import scoreboard as board


def test_update_keeps_the_other_entries_and_records_provenance(scoreboard_file: Path) -> None:
    scoreboard_file.write_text(json.dumps({"old/figure": {"value": 1.0, "unit": "ms"}}))
    entry = _update("offline/m/burst256/infer/output_tok_s", 123.456789, "tok/s")
    assert entry["value"] == 123.4568 and entry["unit"] == "tok/s"
    assert entry["commit"] == "abc123" and entry["gpu"] == "H100" and entry["date"] == "d"
    assert entry["sampling"] == "greedy"
    assert entry["command"]  # this process's command line by default
    entries = board.read()
    assert set(entries) == {"old/figure", "offline/m/burst256/infer/output_tok_s"}
    assert entries["old/figure"] == {"value": 1.0, "unit": "ms"}
    _update("offline/m/burst256/infer/output_tok_s", 200.0, "tok/s")
    assert board.read()["offline/m/burst256/infer/output_tok_s"]["value"] == 200.0
    assert [p.name for p in scoreboard_file.parent.iterdir()] == [
        "scoreboard.json"
    ]  # no temp files


def _update(name: str, value: float, unit: str) -> dict:
    return board.update(name, value, unit, sampling="greedy", commit="abc123", gpu="H100", date="d")


def test_a_failed_write_leaves_the_file_as_it_was(
    scoreboard_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _update("a", 1.0, "x")
    before = scoreboard_file.read_text()

    def broken(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        _update("b", 2.0, "x")
    assert scoreboard_file.read_text() == before
    assert [p.name for p in scoreboard_file.parent.iterdir()] == ["scoreboard.json"]


def _add_many(path: str, worker: int) -> None:
    for i in range(10):
        board.update(
            f"w{worker}/{i}", i, "x", sampling="s", path=Path(path), commit="c", gpu="g", date="d"
        )


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "board.json"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_add_many, args=(str(path), w)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert len(board.read(path)) == 30


def test_summary_values_name_the_headline_figures() -> None:
    summary = {"output_tok_s": 10.0, "ttft_ms": {"p50": 5.0}, "itl_ms": {"p99": None}}
    assert board.summary_values("p", summary) == {
        "p/output_tok_s": (10.0, "tok/s"),
        "p/ttft_p50_ms": (5.0, "ms"),
    }


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="name: must be non-empty"):
        _update(" padded", 1.0, "x")


def test_checked_in_scoreboard_is_well_formed() -> None:
    path = Path(__file__).parents[3] / "benchmarks" / "results" / "scoreboard.json"
    entries = board.read(path)
    assert "offline/llama-3.2-3b/burst256/infer/output_tok_s" in entries
    for name, entry in entries.items():
        assert set(entry) == {"value", "unit", "sampling", "command", "commit", "gpu", "date"}, name
