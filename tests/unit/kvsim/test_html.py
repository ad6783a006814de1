"""``kvsim --html``: each strategy's frames, on the simulated clock, in one page."""

from __future__ import annotations

import base64
import json
import re
import zlib
from pathlib import Path

import numpy as np

from infer.cli import main
from infer.config import EngineConfig
from infer.kvsim.footprint import load_footprint
from infer.kvsim.html import Replay, write_html
from infer.kvsim.simulator import simulate
from infer.kvsim.trace import make_trace

MEMORY = 256 * 2**20


def _replay(strategy: str, memory_only: EngineConfig, max_frames: int = 1000) -> Replay:
    replay = Replay(strategy, max_frames)
    trace = make_trace("shared-prefix", 12, seed=0)
    simulate(trace, strategy, load_footprint("lab", "bfloat16"), MEMORY, memory_only,
             step_s=0.02, replay=replay)  # fmt: skip
    return replay


def _steps(replay: Replay) -> int:
    return sum(len(f["steps"]) for f in replay.frames)


def test_a_frame_per_step_on_the_simulated_clock(memory_only: EngineConfig) -> None:
    replay = _replay("paged+prefix", memory_only)
    times = [f["t"] for f in replay.frames]
    assert times == sorted(times) and times[1] - times[0] == 0.02
    assert all(len(f["steps"]) <= 1 for f in replay.frames)  # none: only a retirement
    assert max(f["shared"] for f in replay.frames) > 0  # the prefix is shared
    assert replay.frames[-1]["used"] == 0 and replay.frames[-1]["requests"] == []
    latencies = [row for f in replay.frames for row in f["latencies"]]
    assert len(latencies) == 12 and all(ttft >= 0.02 for _, ttft, _ in latencies)


def test_without_a_prefix_cache_nothing_is_shared(memory_only: EngineConfig) -> None:
    assert max(f["shared"] for f in _replay("paged", memory_only).frames) == 0


def test_too_many_frames_are_halved_and_keep_every_step(memory_only: EngineConfig) -> None:
    whole = _replay("paged", memory_only)
    coarse = _replay("paged", memory_only, max_frames=10)
    assert len(coarse.frames) <= 10 < len(whole.frames)
    assert _steps(coarse) == _steps(whole)
    assert coarse.frames[-1]["t"] == whole.frames[-1]["t"]


def test_the_page_embeds_every_strategy(memory_only: EngineConfig, tmp_path: Path) -> None:
    path = tmp_path / "kvsim.html"
    write_html(path, "a <test>", [_replay("naive", memory_only), _replay("paged", memory_only)])
    html = path.read_text()
    assert "<title>a &lt;test&gt;</title>" in html
    found = re.search(r'<script type="application/json" id="source">(.*?)</script>', html, re.S)
    assert found is not None
    panels = json.loads(found.group(1))["replay"]
    assert [p["name"] for p in panels] == ["naive", "paged"]
    first = panels[0]["frames"][0]
    assert first["numBlocks"] * 16 * 16 * 1024 <= MEMORY  # lab: 16 KiB per token
    kind = np.frombuffer(zlib.decompress(base64.b64decode(first["kind"])), np.uint8)
    assert len(kind) == first["numBlocks"]


def test_the_cli_writes_the_page(tmp_path: Path) -> None:
    path = tmp_path / "out.html"
    args = ["kvsim", "--model", "lab", "--memory", "256MiB", "--workload", "shared-prefix",
            "--num-requests", "8", "--strategies", "naive,dynamic,paged,paged+prefix",
            "--html", str(path)]  # fmt: skip
    assert main(args) == 0
    html = path.read_text()
    for name in ("naive", "dynamic", "paged", "paged+prefix"):
        assert f'"name":"{name}"' in html
