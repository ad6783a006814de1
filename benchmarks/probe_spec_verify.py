"""Where a speculative verify step's extra time goes (issue 51), against a plain decode step.

An engine (dummy weights) for each of plain decoding and k=1, k=4 proposals a row (made on
the device, every step checking k); at batch 1 and 8 it runs a few dozen decode steps and
reports:

* the mean wall time of ``Engine.step`` (as ``bench_speculative.py --parts verify``);
* host time per step in each phase (schedule, schedule_ahead, propose, launch, graph run,
  sample, collect, update) and whether the steps replayed a graph;
* from ``torch.profiler`` (CUDA activity only, so the host is not slowed): GPU time per step,
  the GPU's idle time per step between kernels (host work the device waits for) and the
  costliest kernels.

    python benchmarks/probe_spec_verify.py [--model llama-3.2-3b] [--steps 48] [--out DIR]

Writes ``probe_spec_verify.json`` under ``--out`` (default ``$OUT/spec``). GPU only.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from bench_speculative import _AlwaysOpen
from infer import LLM, SamplingParams
from infer.engine.core.cuda_graphs import replay_ms
from infer.engine.core.engine import Engine
from infer.kernels.verify_inputs import ProposalMode


class _Phases:
    """Host time per phase, accumulated by wrapping methods in place."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.graphed = 0
        self.eager = 0
        self.on = False

    def wrap(self, owner: Any, name: str, label: str | None = None) -> None:
        original = getattr(owner, name)
        label = label or name

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = original(*args, **kwargs)
            if self.on:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1
                if label.startswith("graphs.run"):
                    if result is None:
                        self.eager += 1
                    else:
                        self.graphed += 1
            return result

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.graphed = self.eager = 0


def _kernel_stats(prof: Any, steps: int) -> dict[str, Any]:
    kernels = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > 0
    ]
    if not kernels:
        return {"kernels": 0}
    intervals = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, cur_s, cur_e = 0.0, intervals[0][0], intervals[0][1]
    for s, e in intervals[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = intervals[-1][1] - intervals[0][0]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        entry = by_name[e.name]
        entry[0] += e.time_range.end - e.time_range.start
        entry[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:15]
    return {
        "kernels_per_step": round(len(kernels) / steps, 1),
        "gpu_busy_ms_per_step": round(busy / steps / 1e3, 4),
        "gpu_span_ms_per_step": round(span / steps / 1e3, 4),
        "gpu_idle_ms_per_step": round((span - busy) / steps / 1e3, 4),
        "top_kernels": [
            {
                "name": name[:90],
                "ms_per_step": round(t / steps / 1e3, 4),
                "calls_per_step": c / steps,
            }
            for name, (t, c) in top
        ],
    }


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_case(engine: Engine, phases: _Phases, k: int, batch: int, steps: int) -> dict[str, Any]:
    """``k`` proposals a row every step (made on the device), or plain steps (``k`` 0)."""
    if k:
        engine.runner.proposal_mode = ProposalMode.REPEAT
        engine.scheduler.gate = _AlwaysOpen(k)  # type: ignore[assignment]
    params = SamplingParams(temperature=0, max_tokens=(steps + 40) * (k + 1), ignore_eos=True)
    generator = torch.Generator().manual_seed(0)
    ids = []
    for _ in range(batch):
        prompt = torch.randint(100, 30000, (128,), generator=generator).tolist()
        ids.append(engine.add_request(prompt, params))
    for _ in range(6):  # prefill and the first decode steps
        engine.step()
    _sync()
    phases.reset()
    phases.on = True
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    phases.on = False
    profiled = 12
    activities = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(profiled):
            engine.step()
        _sync()
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    mean = sum(times) / len(times)
    row: dict[str, Any] = {
        "k": k,
        "batch": batch,
        "step_ms": round(mean * 1e3, 4),
        "step_ms_median": round(sorted(times)[len(times) // 2] * 1e3, 4),
        "graphed_steps": phases.graphed,
        "eager_steps": phases.eager,
        "host_ms_per_step": {
            name: round(s / steps * 1e3, 4) for name, s in sorted(phases.seconds.items())
        },
        "calls": dict(phases.calls),
    }
    row.update(_kernel_stats(prof, profiled))
    return row


def replay_costs(engine: Engine) -> list[dict[str, Any]]:
    """GPU time of replaying each relevant graph alone (CUDA events), on whatever the static
    buffers hold: decode buckets 1 and 8 against the mixed buckets 16 and 64."""
    graphs = engine.runner.graphs
    assert graphs is not None
    rows = []
    for bucket, (graph, _) in graphs._graphs.items():
        if (bucket.decode and bucket.tokens in (1, 8)) or (
            not bucket.decode and bucket.tokens in (16, 64)
        ):
            graphs.seq_lens.zero_()  # rows without tokens (as at capture): writes nothing
            graphs.query_start_loc.zero_()
            graphs.row_counts.zero_()
            graphs.slot_mapping.fill_(-1)
            cost = replay_ms(graph, 20, warmups=3)
            rows.append({"bucket": str(bucket), "empty_replay_ms": round(cost, 4)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.2-3b")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "spec")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    record: dict[str, Any] = {
        "model": args.model,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }
    started = time.perf_counter()
    cases = []
    engine = None
    for k in (0, 1, 4):
        spec = {"num_speculative_tokens": k} if k else None
        llm = LLM(args.model, load_format=args.load_format, gpu_memory_utilization=0.5,
                  speculative_config=spec)  # fmt: skip
        engine = llm.engine
        print(f"engine (k={k}) ready after {time.perf_counter() - started:.1f} s", flush=True)
        phases = _Phases()
        scheduler, runner = engine.scheduler, engine.runner
        for name in ("schedule", "schedule_ahead", "update"):
            phases.wrap(scheduler, name)
        for name in ("launch", "sample", "collect"):
            phases.wrap(runner, name)
        phases.wrap(runner.model, "compute_logits", "compute_logits")
        if runner.graphs is not None:
            for name in ("run", "run_verify"):
                phases.wrap(runner.graphs, name, f"graphs.{name}")
        for batch in (1, 8):
            try:
                row = run_case(engine, phases, k, batch, args.steps)
            except Exception:
                row = {"k": k, "batch": batch, "error": traceback.format_exc()}
            cases.append(row)
            print(json.dumps(row), flush=True)
            partial = record | {"cases": cases}
            (args.out / "probe_spec_verify.json").write_text(json.dumps(partial, indent=1))
        if k < 4:
            del llm, engine, scheduler, runner
            gc.collect()
            torch.cuda.empty_cache()
    try:
        record["replays"] = replay_costs(engine) if cuda else []
        print(json.dumps(record["replays"]), flush=True)
    except Exception:
        record["replays_error"] = traceback.format_exc()
        print(record["replays_error"], flush=True)
    record["cases"] = cases
    record["total_s"] = round(time.perf_counter() - started, 1)
    (args.out / "probe_spec_verify.json").write_text(json.dumps(record, indent=1) + "\n")
    for row in cases:
        if "error" in row:
            print(f"k={row['k']} batch {row['batch']}: ERROR")
            continue
        print(
            f"k={row['k']} b={row['batch']}: step {row['step_ms']:.3f} ms, gpu busy "
            f"{row.get('gpu_busy_ms_per_step')} idle {row.get('gpu_idle_ms_per_step')} ms, "
            f"graphed {row['graphed_steps']}/{row['graphed_steps'] + row['eager_steps']}, host "
            f"{row['host_ms_per_step']}"
        )


if __name__ == "__main__":
    main()
