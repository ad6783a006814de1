"""Runs a workload through an engine in-process, honouring arrival times.

``LLM.generate`` hands the engine a whole batch at once; a workload with staggered arrivals
needs requests added while others run, so ``drive`` steps the engine itself the way
``LLM._run`` does and adds each request when its arrival time has come (or, for sequential
workloads, when the previous one has finished). The same loop drives ``infer``'s engine
(``run_infer``) and the vLLM peer (``infer.bench.vllm_peer``), through ``SteppedEngine``.

For ``infer``, TTFT and ITL come from the engine's own token timestamps
(``RequestOutput.token_times_s``, relative to when the request was added).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import Any, Protocol

from tqdm import tqdm

from infer.bench.metrics import RequestMetrics, RunResult
from infer.bench.sampling import GREEDY, BenchSampling
from infer.engine.engine import Engine
from infer.heap import frozen_heap
from infer.workloads import RequestSpec, Workload


class SteppedEngine(Protocol):
    """What ``drive`` needs of an engine: add a request, run one step."""

    def has_unfinished_requests(self) -> bool: ...

    def wait_to_schedule(self) -> None:
        """Before requests that have arrived are added: wait, if the engine paces its
        launches, until the step in flight is about to end (``Engine.wait_to_schedule``)."""
        ...

    def add(self, request_id: str, spec: RequestSpec) -> None:
        """Queue one request (the run's sampling settings, EOS ignored)."""
        ...

    def step(self, requests: dict[str, RequestMetrics], start: float) -> int:
        """Run one step, filling in the token times (and errors) of ``requests``; returns
        how many requests finished. ``start`` is the run's start (``time.perf_counter``)."""
        ...


def check_fits(workload: Workload, max_seq_len: int) -> None:
    """A request longer than the context would be cut short and skew every number."""
    need = workload.max_sequence_len
    if need > max_seq_len:
        raise ValueError(
            f"max_seq_len: workload {workload.name} needs sequences of up to {need} tokens "
            f"(prompt + output) but the model allows {max_seq_len}; raise --max-seq-len or "
            "lower --max-tokens"
        )


def run_infer(
    engine: Engine,
    workload: Workload,
    warmup: Workload | None = None,
    progress: bool = True,
    sampling: BenchSampling = GREEDY,
) -> RunResult:
    """Run ``warmup`` (unmeasured), then ``workload``; peak KV use and preemptions count the
    measured part only."""
    check_fits(workload, engine.max_seq_len)
    stepped = _InferEngine(engine, sampling)
    if warmup is not None:
        drive(stepped, warmup, "warmup", progress=False)
    engine.peak_utilization = 0.0
    preemptions_before = int(engine.cache_stats()["preemptions"])
    speculation_before = replace(engine.scheduler.speculation)
    requests = drive(stepped, workload, "bench", progress)
    extra: dict[str, Any] = {
        "peak_kv_utilization": round(engine.peak_utilization, 4),
        "preemptions": int(engine.cache_stats()["preemptions"]) - preemptions_before,
    }
    if engine.config.speculative_config is not None:
        extra["speculation"] = engine.scheduler.speculation.since(speculation_before).as_dict()
    return RunResult(requests, extra)


class _InferEngine:
    def __init__(self, engine: Engine, sampling: BenchSampling) -> None:
        self.engine = engine
        self.sampling = sampling

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def wait_to_schedule(self) -> None:
        self.engine.wait_to_schedule()

    def add(self, request_id: str, spec: RequestSpec) -> None:
        params = self.sampling.params(spec.max_tokens)
        self.engine.add_request(spec.prompt_token_ids, params, request_id=request_id)

    def step(self, requests: dict[str, RequestMetrics], start: float) -> int:
        finished = 0
        for out in self.engine.step():
            if out.finished:
                record = requests[out.request_id]
                record.token_times_s = list(out.token_times_s)
                record.error = out.error
                finished += 1
        return finished


def drive(
    engine: SteppedEngine,
    workload: Workload,
    tag: str,
    progress: bool,
    label: str = "infer",
) -> list[RequestMetrics]:
    """Add every request of ``workload`` when it is due and step ``engine`` until all have
    finished; the measured loop runs with the start-up heap frozen (as the server's engine
    process does, ``infer.heap``). Request ids are ``<tag>-<index>``."""
    specs = workload.requests
    order = (
        range(len(specs))
        if workload.sequential
        else sorted(range(len(specs)), key=lambda i: specs[i].arrival_s)
    )
    pending = deque(order)
    metrics: dict[str, RequestMetrics] = {}
    with (
        frozen_heap(),
        tqdm(
            total=len(specs), desc=f"{label} {workload.name}", unit="req", disable=not progress
        ) as bar,
    ):
        start = time.perf_counter()
        while pending or engine.has_unfinished_requests():
            if pending and not workload.sequential:
                engine.wait_to_schedule()
            now = time.perf_counter() - start
            while pending and _is_due(workload, specs[pending[0]].arrival_s, now, engine):
                index = pending[0]
                spec = specs[index]
                request_id = f"{tag}-{index}"
                arrival = time.perf_counter() - start
                engine.add(request_id, spec)
                pending.popleft()
                waited = 0.0 if workload.sequential else max(0.0, arrival - spec.arrival_s)
                metrics[request_id] = RequestMetrics(
                    len(spec.prompt_token_ids), arrival, due_wait_s=waited
                )
            if not engine.has_unfinished_requests():
                if pending:  # idle until the next arrival
                    time.sleep(max(0.0, specs[pending[0]].arrival_s - now))
                continue
            bar.update(engine.step(metrics, start))
    return [metrics[f"{tag}-{i}"] for i in range(len(specs))]


def _is_due(workload: Workload, arrival_s: float, now: float, engine: SteppedEngine) -> bool:
    if workload.sequential:
        return not engine.has_unfinished_requests()
    return arrival_s <= now
