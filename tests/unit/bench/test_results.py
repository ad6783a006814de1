"""Result files and tables: names, provenance, the ratio and roofline columns, failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infer.bench.metrics import RequestMetrics, RunResult, summarize
from infer.bench.results import environment, output_paths, read_json, write_json
from infer.bench.sampling import GREEDY, BenchSampling
from infer.bench.table import format_ceilings, format_roofline, format_table


def _record(engine: str, tok_s_scale: float, **extra: Any) -> dict[str, Any]:
    times = [t / tok_s_scale for t in (0.1, 0.2, 0.3, 0.4)]
    summary = summarize(RunResult([RequestMetrics(8, 0.0, times)]))
    return {"engine": engine, "model": "m", "workload": "w", **summary, **extra}


def test_output_paths() -> None:
    paths, plots = output_paths("out/run.json", "llama-3.2-3b", ["single"], ["infer"], "d")
    assert paths == {("single", "infer"): Path("out/run.json")}
    assert plots == {"single": Path("out/run.png")}
    paths, plots = output_paths("out/run.json", "m", ["a", "b"], ["infer", "hf"], "d")
    assert paths["b", "hf"] == Path("out/run-b-hf.json")
    assert plots["a"] == Path("out/run-a.png")
    paths, _ = output_paths(None, "/ckpt/tiny", ["a"], ["infer"], "2026-01-02T03:04:05Z")
    path = paths["a", "infer"]
    assert path.parent.parts[-2:] == ("benchmarks", "results")
    assert path.name == "tiny-a-2026-01-02T03_04_05Z-infer.json"


def test_a_dotted_output_stem_keeps_its_dots() -> None:
    paths, plots = output_paths("out/llama-3.2-3b", "m", ["a", "b"], ["infer"], "d")
    assert paths["a", "infer"] == Path("out/llama-3.2-3b-a-infer.json")
    assert plots["b"] == Path("out/llama-3.2-3b-b.png")
    paths, _ = output_paths("out/llama-3.2-3b.json", "m", ["a"], ["infer", "vllm"], "d")
    assert paths["a", "vllm"] == Path("out/llama-3.2-3b-vllm.json")


def test_environment_records_where_and_what(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_GIT_COMMIT", "abc123")
    env = environment()
    assert env["git_commit"] == "abc123"
    assert env["gpu"] and env["date"].endswith("Z") and env["torch"]


def test_write_and_read_back(tmp_path: Path) -> None:
    record = _record("infer", 1.0)
    assert read_json(write_json(record, tmp_path / "x" / "r.json")) == record
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a benchmark result"):
        read_json(tmp_path / "bad.json")


def test_table_puts_the_ratio_on_the_infer_row() -> None:
    roofline = {
        "output_tok_s": 40.0,
        "mode": "batch",
        "weight_bytes_per_step": 2e9,
        "decode_steps": 3,
        "decode_bytes": 7e9,
        "prefill_flops": 1e12,
        "prefill_s": 0.1,
        "decode_s": 0.1,
        "copy_tb_s": 3.0,
        "matmul_tflops": 700.0,
    }
    infer = _record(
        "infer", 2.0, roofline=roofline, peak_kv_utilization=0.5, preemptions=0, gpu="H100"
    )
    hf = _record("hf", 1.0)
    table = format_table([hf, infer])
    infer_row, hf_row = table.splitlines()[2:]  # infer first, whatever the input order
    assert "| m | w | greedy | infer |" in infer_row and "| 2.0x |" in infer_row
    assert "| 40 (50%) |" in infer_row and "| 50% |" in infer_row
    assert "| transformers |" in hf_row and hf_row.endswith("| - | - | - | - | 1/1 |")
    roofline_rows = format_roofline([infer, hf]).splitlines()
    assert [row.count("|") for row in roofline_rows] == [12, 12, 12]
    assert roofline_rows[2] == (
        "| m | w | greedy | batch | 2.00 | 3 | 7.0 | 1.00 | 0.1 + 0.1 | 40 | 50% |"
    )
    assert (
        format_ceilings([infer])
        == "- H100: copy 3.0 TB/s (read + write), bf16 matmul 700.0 TFLOP/s"
    )


def test_table_pairs_each_infer_run_with_the_same_run_of_vllm() -> None:
    t1 = BenchSampling(1.0).as_dict()
    records = [
        _record("infer", 2.0),  # from before sampling and runs were recorded: greedy
        _record("vllm", 1.0),
        _record("infer", 2.0, sampling=t1),  # no "run": named from workload and sampling
        _record("vllm", 4.0, sampling=t1),
        _record("infer", 3.0, sampling=GREEDY.as_dict(), run="w-2"),  # greedy given twice
        _record("vllm", 1.0, sampling=GREEDY.as_dict(), run="w-2"),
    ]
    rows = format_table(records).splitlines()
    assert "| workload | sampling | engine |" in rows[0]
    assert "| w | greedy | infer |" in rows[2] and rows[2].endswith("| 2.0x | - | 1/1 |")
    assert "| w | greedy | vLLM |" in rows[3]
    assert "| w | t1 | infer |" in rows[4] and rows[4].endswith("| 0.5x | - | 1/1 |")
    assert "| w | t1 | vLLM |" in rows[5]
    assert "| w | greedy | infer |" in rows[6] and rows[6].endswith("| 3.0x | - | 1/1 |")
    assert len(rows) == 8


def test_table_shows_failed_runs() -> None:
    failed = {
        "engine": "hf",
        "model": "m",
        "workload": "w",
        "num_requests": 4,
        "num_failed": 4,
        "errors": ["RuntimeError: boom"],
        "output_tok_s": 0.0,
    }
    assert "| m | w | greedy | transformers | failed: RuntimeError: boom |" in format_table(
        [failed]
    )
