"""``infer bench offline --engine vllm`` on the CPU, against a stand-in for vLLM's API
(``data/fake_vllm``): the requests, the driving loop, the record; and the error without vLLM."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from infer.bench.table import format_table
from infer.cli import main
from infer.cli.bench import parse_engines

FAKE_VLLM = Path(__file__).parent / "data" / "fake_vllm"


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FAKE_VLLM))
    for name in ("vllm", "vllm.sampling_params"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def _offline(model: Path, *flags: str) -> list[str]:
    cpu = "--device cpu --num-gpu-blocks 64 --max-seq-len 512 --no-progress --warmup 1"
    return ["bench", "offline", "--model", str(model), *cpu.split(), *flags]


@pytest.mark.usefixtures("fake_vllm")
def test_vllm_runs_the_same_requests_with_their_arrivals(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    output = tmp_path / "v.json"
    flags = ["--engine", "vllm", "--workload", "continuous_batching", "--num-requests", "3"]
    argv = _offline(tiny_checkpoint("qwen3"), *flags, "--max-tokens", "4", "--output", str(output))
    assert main(argv) == 0
    record = json.loads(output.read_text())
    assert record["engine"] == "vllm" and record["num_failed"] == 0
    assert [r["output_tokens"] for r in record["requests"]] == [4, 4, 4]
    arrivals = [r["arrival_s"] for r in record["requests"]]
    assert arrivals[0] == 0.0 and arrivals[1] >= 0.25 and arrivals[2] >= 0.5  # 4 req/s
    details = record["engine_config"]
    assert details["vllm"] == "0.0-fake" and details["load_format"] == "auto"
    assert details["skip_tokenizer_init"] and details["max_model_len"] == 512
    assert details["model"] == str(tiny_checkpoint("qwen3"))
    assert "generate_output_tok_s" not in record  # arrivals spread out: not a burst


@pytest.mark.usefixtures("fake_vllm")
def test_a_burst_is_also_timed_through_generate(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    output = tmp_path / "b.json"
    flags = ["--engine", "vllm", "--workload", "burst256", "--num-requests", "4"]
    argv = _offline(tiny_checkpoint("llama"), *flags, "--max-tokens", "3", "--output", str(output))
    assert main(argv) == 0
    record = json.loads(output.read_text())
    assert record["output_tokens"] == 12 and record["generate_output_tok_s"] > 0


@pytest.mark.usefixtures("fake_vllm")
def test_a_preset_becomes_a_config_folder_with_dummy_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infer.bench.vllm_peer import model_folder

    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))
    folder, load_format = model_folder("gemma-3-1b", "dummy")
    config = json.loads((Path(folder) / "config.json").read_text())
    assert load_format == "dummy" and config["architectures"] == ["Gemma3ForCausalLM"]
    assert folder == str(tmp_path / "vllm-peer" / "gemma-3-1b")


def test_without_vllm_the_error_says_how_to_get_it(
    tiny_checkpoint: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else find_spec(name, *a),
    )
    argv = _offline(tiny_checkpoint("llama"), "--engine", "infer,vllm", "--workload", "single")
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "engine: vllm is not importable" in error and "/tmp/vsite" in error


def test_engine_lists() -> None:
    assert parse_engines("both") == ["infer", "hf"]
    assert parse_engines("infer, vllm,hf") == ["infer", "vllm", "hf"]
    assert parse_engines("both,vllm,infer") == ["infer", "hf", "vllm"]
    with pytest.raises(ValueError, match="engine: unknown 'sglang'"):
        parse_engines("infer,sglang")


def test_table_has_a_ratio_to_each_peer() -> None:
    def record(engine: str, tok_s: float) -> dict:
        stats = {"p50": 1.0, "p99": 2.0}
        return {
            "engine": engine, "model": "m", "workload": "w", "output_tok_s": tok_s,
            "requests_per_s": 1.0, "ttft_ms": stats, "itl_ms": stats, "e2e_ms": stats,
            "num_requests": 1, "num_failed": 0,
        }  # fmt: skip

    rows = format_table([record("hf", 1.0), record("vllm", 4.0), record("infer", 2.0)]).splitlines()
    assert "| vs vLLM | vs transformers | ok |" in rows[0]
    assert "| infer |" in rows[2] and rows[2].endswith("| 0.5x | 2.0x | 1/1 |")
    assert "| vLLM |" in rows[3] and "| transformers |" in rows[4]
