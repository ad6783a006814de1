"""Reading ``vllm bench serve`` results into the comparison table (fixture: the field names
vLLM 0.26's ``vllm/benchmarks/serve.py`` writes with ``--save-result --save-detailed
--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infer.bench.vllm_bench import (
    SERVING_WORKLOADS,
    client_command,
    format_comparison,
    format_startup,
    median_run,
    parse_samplings,
    parse_serving_workloads,
    read_bench,
    scoreboard_values,
    summarize_bench,
)

FIXTURE = Path(__file__).parent / "data" / "vllm_bench_serve.json"


def _fixture() -> dict[str, Any]:
    return read_bench(FIXTURE)


def test_completions_figures_are_vllms_own() -> None:
    """Recomputed from the per-request lists, a completions run gives vLLM's summary."""
    result = _fixture()
    row = summarize_bench(result, SERVING_WORKLOADS["completions"], "vllm", "greedy")
    assert row["output_tok_s"] == result["output_throughput"] == 12.0
    assert (row["completed"], row["failed"], row["num_prompts"]) == (2, 1, 3)
    assert row["errors"] == [
        "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected"
    ]
    for metric in ("ttft", "itl", "tpot"):
        stats = row[f"{metric}_ms"]
        assert stats["p50"] == pytest.approx(result[f"median_{metric}_ms"], abs=1e-3)
        assert stats["p90"] == pytest.approx(result[f"p90_{metric}_ms"], abs=1e-3)
        assert stats["p99"] == pytest.approx(result[f"p99_{metric}_ms"], abs=1e-3)
        assert stats["mean"] == pytest.approx(result[f"mean_{metric}_ms"], abs=1e-3)


def test_chat_ttft_counts_to_the_first_token_not_the_role_chunk() -> None:
    """Request 0: role chunk at 10 ms, tokens at 110, 130, 150 ms; request 1: 12 ms, then
    212, 242, 272 ms."""
    row = summarize_bench(_fixture(), SERVING_WORKLOADS["chat"], "infer", "greedy")
    assert row["ttft_ms"]["p50"] == pytest.approx(161.0)  # (110 + 212) / 2
    assert row["itl_ms"]["p50"] == pytest.approx(25.0)  # 20, 20, 30, 30: no role gap
    assert row["tpot_ms"]["p50"] == pytest.approx(25.0)  # (150 - 110) / 2, (272 - 212) / 2
    assert row["ttft_to"] == "first token"


def test_without_detail_the_summary_fields_are_used() -> None:
    result = {k: v for k, v in _fixture().items() if k not in ("ttfts", "itls", "errors")}
    row = summarize_bench(result, SERVING_WORKLOADS["chat"], "vllm", "greedy")
    assert row["ttft_ms"] == {"p50": 11.0, "p90": 11.8, "p99": 11.98, "mean": 11.0}
    assert row["itl_ms"]["p90"] == 150.0 and row["tpot_ms"]["p50"] == 100.0
    assert row["ttft_to"] == "role chunk"


def test_not_a_bench_result_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"output_tok_s": 1.0}))
    with pytest.raises(ValueError, match="not a vllm bench serve result"):
        read_bench(path)


def _row(
    server: str, workload: str, tok_s: float, ttft: float, tpot: float, sampling: str = "greedy"
) -> dict[str, Any]:
    def stats(p50: float) -> dict[str, float]:
        return {"p50": p50, "p90": p50 * 2, "p99": p50 * 3, "mean": p50}

    return {
        "server": server,
        "workload": workload,
        "sampling": sampling,
        "output_tok_s": tok_s,
        "ttft_ms": stats(ttft),
        "itl_ms": stats(tpot),
        "tpot_ms": stats(tpot),
        "completed": 256,
        "failed": 0,
        "num_prompts": 256,
    }


def test_comparison_table_puts_infer_first_with_the_ratios_of_the_same_sampling() -> None:
    rows = [
        _row("vllm", "chat", 10_000.0, 400.0, 10.0),
        _row("infer", "chat", 12_000.0, 200.0, 8.0),
        _row("infer", "chat", 9_000.0, 200.0, 8.0, sampling="defaults"),
        _row("vllm", "chat", 6_000.0, 200.0, 8.0, sampling="defaults"),
    ]
    lines = format_comparison(rows).splitlines()
    assert lines[2].startswith(
        "| chat | greedy | infer | 12,000.0 | 200.0 / 600.0 | 8.0 / 16.0 / 24.0 |"
    )
    assert lines[2].endswith("| 256/256 | 1.20x | 2.00x / 1.25x |")
    assert lines[3].startswith("| chat | greedy | vllm |") and lines[3].endswith("| - | - |")
    assert lines[4].startswith("| chat | defaults | infer |") and "| 1.50x |" in lines[4]


def test_repeats_are_reported_by_their_median_run_with_the_range() -> None:
    runs = [_row("infer", "chat", tok_s, 200.0, 8.0) for tok_s in (15_000.0, 19_000.0, 18_000.0)]
    row = median_run(runs)
    assert row["output_tok_s"] == 18_000.0
    assert row["repeats_output_tok_s"] == [15_000.0, 19_000.0, 18_000.0]
    assert median_run(runs[:2])["output_tok_s"] == 15_000.0  # the lower middle of two
    line = format_comparison([row]).splitlines()[2]
    assert line.startswith("| chat | greedy | infer | 18,000.0 (15,000-19,000) |")


def test_scoreboard_values_and_startup_table() -> None:
    rows = [_row("infer", "poisson", 900.0, 50.0, 5.0), _row("vllm", "poisson", 1_000.0, 40.0, 4.0)]
    startups = [
        {
            "server": "infer",
            "ready_s": 41.5,
            "markers": {"KV cache sized": {"s": 20.0, "kind": "at"}},
        },
        {"server": "vllm", "ready_s": None, "markers": {}},
    ]
    values = scoreboard_values("llama-3.2-3b", rows, startups, "greedy")
    assert values["serving/llama-3.2-3b/poisson/greedy/infer/output_tok_s"] == (900.0, "tok/s")
    assert values["serving/llama-3.2-3b/poisson/greedy/vllm/itl_p90_ms"] == (8.0, "ms")
    assert values["serving/llama-3.2-3b/poisson/greedy/infer_vs_vllm"] == (0.9, "x")
    assert values["serving/llama-3.2-3b/infer/startup_s"] == (41.5, "s")
    assert "serving/llama-3.2-3b/vllm/startup_s" not in values
    table = format_startup(startups)
    assert "| infer | 41.5 | KV cache sized at 20.0 s |" in table
    assert "| vllm | failed | no markers in the log |" in table


def test_client_command_matches_the_issue() -> None:
    poisson = SERVING_WORKLOADS["poisson"]
    command = client_command("python3", poisson, "http://h:1", "/ckpt", "m", Path("/r/x.json"))
    text = " ".join(command)
    assert text.startswith("python3 -m vllm.entrypoints.cli.main bench serve --backend vllm")
    for part in (
        "--endpoint /v1/completions",
        "--num-prompts 64",
        "--request-rate 6",
        "--random-input-len 1536",
        "--random-output-len 160",
        "--ignore-eos",
        "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99",
        "--result-dir /r --result-filename x.json",
    ):
        assert part in text
    ratio = json.loads(command[command.index("--random-range-ratio") + 1])
    # vLLM samples lengths in [floor(len * (1 - r)), ceil(len * (1 + r))]: 1024-2048, 64-256
    assert int(1536 * (1 - ratio["input"])) == 1024 and round(1536 * (1 + ratio["input"])) == 2048
    assert int(160 * (1 - ratio["output"])) == 64 and round(160 * (1 + ratio["output"])) == 256
    assert "--temperature" not in command  # the client's defaults: what its users get
    greedy = client_command("p", poisson, "u", "/c", "m", Path("r.json"), sampling="greedy")
    assert greedy[greedy.index("--temperature") + 1] == "0"
    chat = client_command("p", SERVING_WORKLOADS["chat"], "u", "/c", "m", Path("r.json"))
    assert chat[chat.index("--backend") + 1] == "openai-chat"
    assert chat[chat.index("--endpoint") + 1] == "/v1/chat/completions"


def test_sampling_names_are_checked() -> None:
    assert parse_samplings("defaults, greedy") == ["defaults", "greedy"]
    with pytest.raises(ValueError, match="samplings: unknown"):
        parse_samplings("t0.7")


def test_workload_names_are_checked() -> None:
    assert [w.name for w in parse_serving_workloads("chat, poisson")] == ["chat", "poisson"]
    with pytest.raises(ValueError, match="workloads: unknown"):
        parse_serving_workloads("chat,nope")
