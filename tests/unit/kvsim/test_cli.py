"""``infer kvsim``: simulation, --explain-cache and the plan subcommand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer.cli import main


def test_explain_cache(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kvsim", "--explain-cache", "--prompt", "128", "--generate", "100"]) == 0
    out = capsys.readouterr().out
    assert "17,978" in out and "228" in out


def test_simulation_json_and_plots(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(
        [
            "kvsim",
            "--model",
            "lab",
            "--memory",
            "16GiB",
            "--workload",
            "lab",
            "--json",
            "--plot",
            str(tmp_path),
        ]
    )
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["strategy"] for row in rows] == [
        "naive",
        "dynamic",
        "paged",
        "paged+prefix",
        "paged+window",
    ]
    assert rows[0]["internal_fragmentation"] > 0.8
    assert all(row["max_concurrent_sequences"] == 16 for row in rows)
    assert (tmp_path / "kvsim_memory.png").is_file()
    assert (tmp_path / "kvsim_concurrency.png").is_file()


def test_simulation_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "kvsim",
            "--model",
            "gemma-3-1b",
            "--memory",
            "64MiB",
            "--workload",
            "shared-prefix",
            "--num-requests",
            "8",
            "--strategies",
            "paged,paged+window",
            "--max-batch-size",
            "4",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "22 of 26 layers keep only the last 512 tokens" in out
    assert "max concurrent sequences" in out
    concurrency = next(line for line in out.splitlines() if line.startswith("max concurrent"))
    assert concurrency.split()[-2:] == ["4", "4"]  # --max-batch-size is the engine's limit


def test_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "kvsim",
            "plan",
            "--model",
            "lab",
            "--gpu-memory",
            "40GiB",
            "--avg-tokens",
            "300",
            "--peak-tokens",
            "2000",
            "--users",
            "128",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "1,280" in out and "608.0 MiB" in out
    assert (
        main(
            [
                "kvsim",
                "plan",
                "--model",
                "lab",
                "--gpu-memory",
                "512MiB",
                "--avg-tokens",
                "256,4096",
                "--max-seq-len",
                "4096",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [row["capacity_gain"] for row in rows] == [16.0, 1.0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["kvsim", "--model", "lab", "--memory", "16GiB"], "workload: --workload is required"),
        (["kvsim", "--model", "lab", "--memory", "lots", "--workload", "lab"], "memory: "),
        (
            [
                "kvsim",
                "--model",
                "lab",
                "--memory",
                "1GiB",
                "--workload",
                "lab",
                "--strategies",
                "buddy",
            ],
            "strategies: ",
        ),
        (
            ["kvsim", "plan", "--model", "lab", "--gpu-memory", "1GiB", "--avg-tokens", "x"],
            "avg_tokens: ",
        ),
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
