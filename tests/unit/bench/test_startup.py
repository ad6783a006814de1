"""Start-up timing: log lines stamped as they arrive, markers read from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infer.bench.startup import (
    INFER_MARKERS,
    VLLM_MARKERS,
    LoggedProcess,
    describe_markers,
    find_markers,
)

_CORE = "(EngineCore pid=1) INFO 11-23 19:00:01 "
VLLM_LOG = [
    (10.0, _CORE + "[default_loader.py:291] Loading weights took 0.52 seconds"),
    (
        11.0,
        _CORE
        + "[gpu_model_runner.py:5348] Model loading took 6.02 GiB memory and 1.234567 seconds",
    ),
    (50.0, _CORE + "[monitor.py:20] torch.compile took 35.10 s in total"),
    (70.0, _CORE + "[gpu_model_runner.py:6845] Graph capturing finished in 12 secs, took 0.50 GiB"),
    (
        71.0,
        _CORE + "[core.py:348] init engine (profile, create kv cache, warmup model) took 58.40 s",
    ),
    (80.0, "(APIServer pid=0) INFO:     Application startup complete."),
]


def test_vllm_reports_its_own_durations() -> None:
    found = find_markers(VLLM_LOG, VLLM_MARKERS)
    assert found["weights loaded in"] == {"s": 0.52, "kind": "duration"}
    assert found["model loaded in"]["s"] == pytest.approx(1.234567)
    assert found["torch.compile in"]["s"] == 35.1
    assert found["CUDA graph capture in"]["s"] == 12.0
    assert found["engine init (profile, KV cache, warm-up) in"]["s"] == 58.4
    assert found["HTTP listening"] == {"s": 80.0, "kind": "at"}
    assert "profiling / warm-up run in" not in found
    assert "torch.compile in 35.1 s" in describe_markers(found)


def test_infer_markers_read_the_start_up_log() -> None:
    prefix = "INFO infer.engine.setup.start_up_log: start-up: "
    lines = [
        (3.0, "INFO:     Started server process [1]"),
        (9.0, prefix + "llama-3.2-3b: load the weights in 4.10 s"),
        (
            20.25,
            prefix + "llama-3.2-3b: size the KV cache in 11.02 s; kernel variants: 9 "
            "compiled, 0 from the kernel cache",
        ),
        (22.0, prefix + "wait for the sampling kernels (compiled beside the loading) in 0.50 s"),
        (30.0, prefix + "llama-3.2-3b: capture 40 CUDA graphs in 7.90 s"),
        (33.0, prefix + "warm-up (the first traffic, rehearsed): all parts in 2.96 s"),
        (33.5, "INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)"),
    ]
    found = find_markers(lines, INFER_MARKERS)
    assert [entry["s"] for entry in found.values()] == [3.0, 4.1, 11.02, 0.5, 7.9, 2.96, 33.5]
    assert "step kernels warmed up in" not in found
    assert describe_markers({}) == "no markers in the log"


def test_logged_process_stamps_lines_and_stops(tmp_path: Path) -> None:
    script = (
        "import time; print('one', flush=True); time.sleep(0.3); "
        "print('two\\rthree', flush=True); time.sleep(60)"
    )
    logged = LoggedProcess.start([sys.executable, "-c", script], tmp_path / "log")
    with pytest.raises(RuntimeError, match="not ready after"):
        logged.wait_ready("http://127.0.0.1:9", timeout_s=1.0)  # nothing listens there
    assert logged.stop(grace_s=5) != 0
    assert [line for _, line in logged.lines] == ["one", "two", "three"]
    assert logged.lines[1][0] - logged.lines[0][0] >= 0.25
    assert (tmp_path / "log").read_text().splitlines()[0].endswith("] one")


def test_a_server_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    script = "import sys; print('bad flag'); sys.exit(2)"
    logged = LoggedProcess.start([sys.executable, "-c", script], tmp_path / "log")
    with pytest.raises(RuntimeError, match="exited \\(2\\) before it was ready:\nbad flag"):
        logged.wait_ready("http://127.0.0.1:9", timeout_s=30.0)
    assert logged.stop() == 2
