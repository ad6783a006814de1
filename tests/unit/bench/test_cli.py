"""``infer bench`` end to end on the CPU: offline (infer and transformers), serve, table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from infer.cli import main

from .conftest import FakeServer

REQUIRED = "output_tok_s requests_per_s ttft_ms itl_ms e2e_ms num_requests model gpu git_commit"


def _offline(model: Path, max_seq_len: int) -> list[str]:
    """``infer bench offline`` on a tiny checkpoint on the CPU."""
    flags = f"--device cpu --num-gpu-blocks 64 --max-seq-len {max_seq_len} --no-progress"
    return ["bench", "offline", "--model", str(model), *flags.split()]


def _check_record(path: Path, engine: str, workload: str, requests: int) -> dict:
    record = json.loads(path.read_text())
    assert all(key in record for key in REQUIRED.split())
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(record[key]) >= {"p50", "p90", "p99"}
    assert record["engine"] == engine and record["workload"] == workload
    assert record["num_requests"] == requests and record["num_failed"] == 0
    assert record["output_tok_s"] > 0
    return record


@pytest.mark.slow
def test_offline_both_engines_side_by_side(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "run.json"
    flags = "--engine both --workload single,burst256 --num-requests 2 --max-tokens 3 --warmup 0"
    argv = [*_offline(tiny_checkpoint("qwen3"), 512), *flags.split(), "--output", str(output)]
    assert main([*argv, "--plot"]) == 0
    for workload in ("single", "burst256"):
        infer = _check_record(tmp_path / f"run-{workload}-infer.json", "infer", workload, 2)
        assert infer["engine_config"]["device"] == "cpu" and "roofline" in infer
        assert infer["preemptions"] == 0 and infer["peak_kv_utilization"] > 0
        hf = _check_record(tmp_path / f"run-{workload}-hf.json", "hf", workload, 2)
        assert hf["hf_api"] == ("generate" if workload == "single" else "continuous batching")
        assert all(r["output_tokens"] == 3 for r in infer["requests"] + hf["requests"])
        assert (tmp_path / f"run-{workload}.png").stat().st_size > 10_000
    table = capsys.readouterr().out
    assert table.count("| transformers |") == 2
    ratio_rows = [line for line in table.splitlines() if "| infer |" in line]
    assert len(ratio_rows) == 2 and all(
        row.split("|")[-3].strip().endswith("x") for row in ratio_rows
    )

    files = [str(path) for path in sorted(tmp_path.glob("*.json"))]
    assert main(["bench", "table", *files, "--output", str(tmp_path / "table.md")]) == 0
    assert (tmp_path / "table.md").read_text().count("| infer |") == 2


def test_offline_single_engine_writes_exactly_the_output_file(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    output = tmp_path / "one.json"
    flags = "--workload continuous_batching --num-requests 3 --max-tokens 2"
    argv = [*_offline(tiny_checkpoint("llama"), 512), *flags.split(), "--output", str(output)]
    assert main(argv) == 0
    record = _check_record(output, "infer", "continuous_batching", 3)
    # Added when due (between engine steps), never before: 4 requests/s.
    arrivals = [r["arrival_s"] for r in record["requests"]]
    assert arrivals[0] == 0.0 and arrivals[1] >= 0.25 and arrivals[2] >= 0.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.json"]


def test_each_run_of_a_repeated_label_has_its_own_file_and_row(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stem = tmp_path / "llama-3.2-3b"  # the dots stay in the file names
    flags = "--workload single --max-tokens 2 --warmup 0 --sampling greedy,greedy,t1"
    argv = [*_offline(tiny_checkpoint("llama"), 512), *flags.split(), "--output", str(stem)]
    assert main(argv) == 0
    for run in ("single", "single-2", "single-t1"):
        record = _check_record(tmp_path / f"llama-3.2-3b-{run}-infer.json", "infer", "single", 1)
        assert record["run"] == run
    assert len(list(tmp_path.iterdir())) == 3
    rows = [line for line in capsys.readouterr().out.splitlines() if "| infer |" in line]
    assert [row.split(" | ")[2] for row in rows] == ["greedy", "greedy", "t1"]


def test_serve_against_a_fake_server(fake_server: FakeServer, tmp_path: Path) -> None:
    output = tmp_path / "serve.json"
    flags = "--workload paged_attention --num-requests 3 --max-tokens 4 --vocab-size 320 --warmup 1"
    argv = ["bench", "serve", "--url", fake_server.url, *flags.split(), "--output", str(output)]
    assert main([*argv, "--plot", "--no-progress"]) == 0
    record = _check_record(output, "server", "paged_attention", 3)
    assert record["model"] == "fake-model" and record["output_tokens"] == 12
    assert len(fake_server.received) == 4  # one warm-up, three measured
    assert output.with_suffix(".png").exists()
    assert {body["temperature"] for _, body in fake_server.received} == {0.0}


def test_serve_sends_the_temperature_asked_for(
    fake_server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = "--workload single --max-tokens 2 --vocab-size 320 --warmup 0 --no-progress"
    argv = ["bench", "serve", "--url", fake_server.url, *flags.split()]
    output = ["--output", str(tmp_path / "t1.json")]
    assert main([*argv, *output, "--temperature", "1.0"]) == 0
    assert [body["temperature"] for _, body in fake_server.received] == [1.0]
    assert _check_record(tmp_path / "t1.json", "server", "single", 1)["temperature"] == 1.0
    assert main([*argv, "--temperature", "-1"]) == 2
    assert "temperature: must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "workload: unknown 'nope'"),
        (["--workload", "single", "--max-tokens", "0"], "max_tokens: must be >= 1"),
        (["--workload", "single"], "max_seq_len: workload single needs"),
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str],
    message: str,
    tiny_checkpoint: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*_offline(tiny_checkpoint("llama"), 256), *argv]) == 2
    assert message in capsys.readouterr().err


def test_fp8_figures_get_names_of_their_own() -> None:
    from infer.cli.bench import _precision_suffix
    from infer.config import EngineConfig

    assert _precision_suffix(EngineConfig(device="cpu")) == ""
    fp8 = EngineConfig(device="cpu", quantization="fp8", kv_cache_dtype="fp8")
    assert _precision_suffix(fp8) == "-fp8-kvfp8"
    assert _precision_suffix(EngineConfig(device="cpu", kv_cache_dtype="fp8")) == "-kvfp8"
