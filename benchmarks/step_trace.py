"""A timeline of the engine's steps, for finding where a run's time goes (diagnosis only).

``trace_engine(engine, path)`` wraps the engine's scheduler and runner methods in place and
appends one JSON line per call to ``path``: the method, its start and end
(``time.perf_counter``, comparable across the processes of one machine) and what it handled
(chunks, tokens, prompt tokens, rows that sample, graph or eager). Full garbage collections
are recorded too (``gc``: how many objects they saw and whether the heap was frozen), since
one can stall a step for tens of milliseconds. ``summarize(path)`` turns
such a file into per-phase totals and the steps' shapes over time.

    engine = LLM(...).engine;  trace_engine(engine, Path("trace.jsonl"))
    python benchmarks/step_trace.py trace.jsonl [--from S --to S]   # the summary
    python benchmarks/step_trace.py trace.jsonl --workload prefix_caching   # trace, then sum up
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from infer.engine.core.engine import Engine
from infer.engine.core.step import Step


def _shape(out: Step | None) -> dict[str, Any]:
    if out is None:
        return {"chunks": 0}
    prompt = sum(c.num_tokens for c in out.chunks if c.num_tokens > 1)
    return {
        "chunks": len(out.chunks),
        "tokens": out.num_tokens,
        "prompt_tokens": prompt,
        "samples": len(out.chunks_that_sample()),
        "fed": len(out.fed_rows),
    }


class _Writer:
    def __init__(self, path: Path) -> None:
        self.file: TextIO = path.open("a")

    def write(self, name: str, start: float, end: float, info: dict[str, Any]) -> None:
        self.file.write(json.dumps({"ev": name, "t0": start, "t1": end, **info}) + "\n")

    def flush(self) -> None:
        self.file.flush()


def _wrap(
    owner: Any,
    name: str,
    writer: _Writer,
    info: Callable[[tuple[Any, ...], Any], dict[str, Any]],
    flush: bool = False,
) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = original(*args, **kwargs)
        writer.write(name, start, time.perf_counter(), info(args, result))
        if flush:
            writer.flush()
        return result

    setattr(owner, name, traced)


def trace_engine(engine: Engine, path: Path) -> None:
    """Record every step's phases of ``engine`` into ``path`` (JSON lines, appended)."""
    writer = _Writer(path)
    none: Callable[[tuple[Any, ...], Any], dict[str, Any]] = lambda args, result: {}
    _wrap(engine.scheduler, "schedule", writer, lambda a, r: _shape(r))
    _wrap(engine.scheduler, "schedule_ahead", writer, lambda a, r: _shape(r))
    _wrap(engine.scheduler, "update", writer, lambda a, r: {"tokens": len(r)})
    _wrap(engine.runner, "launch", writer, lambda a, r: _shape(a[0]))
    _wrap(engine.runner, "sample", writer, lambda a, r: {"rows": len(a[0].rows)})
    _wrap(engine.runner, "collect", writer, none)
    if engine.runner.graphs is not None:
        _wrap(engine.runner.graphs, "run", writer, lambda a, r: {"graph": r is not None})
    _wrap(engine, "add_request", writer, lambda a, r: {"prompt": len(a[0])})
    _record_full_collections(writer)
    _wrap(
        engine,
        "step",
        writer,
        lambda a, r: {
            "outputs": len(r),
            "running": engine.num_running,
            "waiting": engine.num_waiting,
        },
        flush=True,
    )


def _record_full_collections(writer: _Writer) -> None:
    started: dict[str, Any] = {}

    def record(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started.update(objects=len(gc.get_objects(generation=2)))
            started.update(frozen=gc.get_freeze_count(), t0=time.perf_counter())
            return
        what = {k: started[k] for k in ("objects", "frozen")}
        writer.write("gc", started["t0"], time.perf_counter(), what)

    gc.callbacks.append(record)


def summarize(path: Path, start: float | None = None, end: float | None = None) -> None:
    """Print the time spent per phase and the steps' shapes between ``start`` and ``end``
    (seconds from the first event)."""
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not events:
        print("no events")
        return
    origin = min(e["t0"] for e in events)
    lo = origin + (start or 0.0)
    hi = origin + end if end is not None else float("inf")
    events = [e for e in events if lo <= e["t0"] <= hi]
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        totals[e["ev"]] += e["t1"] - e["t0"]
        counts[e["ev"]] += 1
    span = max(e["t1"] for e in events) - min(e["t0"] for e in events)
    print(f"{path}: {len(events)} events over {span:.3f} s")
    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(
            f"  {name:15s} {counts[name]:6d} calls  {1000 * seconds:9.1f} ms  "
            f"{1000 * seconds / counts[name]:7.3f} ms/call"
        )
    _device_times(events)
    print("\n  t (ms)   event           ms      what")
    for e in events:
        what = {k: v for k, v in e.items() if k not in ("ev", "t0", "t1")}
        at, took = 1000 * (e["t0"] - origin), 1000 * (e["t1"] - e["t0"])
        print(f"  {at:8.1f} {e['ev']:15s} {took:7.2f}  {what}")


def _device_times(events: list[dict[str, Any]]) -> None:
    """Each step's device time, by whether it holds prompt tokens: with one step always
    queued, a step runs from the end of the collect before it (or its own queueing, if later)
    to the end of its own collect. Steps are collected in the order they are queued."""
    forwards = [e for e in events if e["ev"] == "launch"]
    collects = [e for e in events if e["ev"] == "collect"]
    times: dict[str, list[float]] = defaultdict(list)
    for i in range(1, min(len(forwards), len(collects))):
        began = max(collects[i - 1]["t1"], forwards[i]["t1"])
        kind = "with prompt tokens" if forwards[i].get("prompt_tokens", 0) else "decode only"
        times[kind].append(1000 * (collects[i]["t1"] - began))
    for kind, ms in sorted(times.items()):
        print(f"  device ms a step, {kind}: p50 {statistics.median(ms):.2f} over {len(ms)} steps")


def trace_workload(args: argparse.Namespace) -> None:
    """Run ``args.workload`` on dummy weights through ``run_infer`` with the engine traced."""
    from infer import LLM
    from infer.bench.offline import run_infer
    from infer.workloads import make_workload

    llm = LLM(args.model, load_format="dummy", use_prefix_caching=not args.no_prefix_caching)
    vocab = llm.engine.model_config.vocab_size
    workload = make_workload(args.workload, vocab)
    # As `infer bench` warms up (two requests of another seed), or with every measured prompt.
    warmup = workload if args.warm_prompts else make_workload(args.workload, vocab, 2, seed=1)
    run_infer(llm.engine, warmup.capped(8), progress=False)
    trace_engine(llm.engine, args.trace)
    run_infer(llm.engine, workload, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--from", dest="start", type=float, help="seconds from the first event")
    parser.add_argument("--to", dest="end", type=float)
    parser.add_argument("--workload", help="first trace this workload (GPU, dummy weights)")
    parser.add_argument("--model", default="llama-3.2-3b")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument(
        "--warm-prompts", action="store_true", help="cache every prompt before the traced run"
    )
    args = parser.parse_args()
    if args.workload:
        trace_workload(args)
    summarize(args.trace, args.start, args.end)


if __name__ == "__main__":
    main()
