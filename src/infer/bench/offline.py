"""Runs a workload through the ``infer`` engine in-process, honouring arrival times.

``LLM.generate`` hands the engine a whole batch at once; a workload with staggered arrivals
needs requests added while others run, so this drives ``llm.engine`` step by step the way
``LLM._run`` does and adds each request when its arrival time has come (or, for sequential
workloads, when the previous one has finished). TTFT and ITL come from the engine's own token
timestamps (``RequestOutput.token_times_s``, relative to when the request was added).
"""

from __future__ import annotations

import time
from collections import deque

from tqdm import tqdm

from infer.bench.metrics import RequestMetrics, RunResult
from infer.bench.workloads import Workload
from infer.engine.engine import Engine
from infer.engine.sampling_params import SamplingParams
from infer.heap import frozen_heap


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
    engine: Engine, workload: Workload, warmup: Workload | None = None, progress: bool = True
) -> RunResult:
    """Run ``warmup`` (unmeasured), then ``workload``; peak KV use and preemptions count the
    measured part only."""
    check_fits(workload, engine.max_seq_len)
    if warmup is not None:
        _drive(engine, warmup, "warmup", progress=False)
    engine.peak_utilization = 0.0
    preemptions_before = int(engine.cache_stats()["preemptions"])
    with frozen_heap():  # as the server's engine process does (``infer.heap``)
        requests = _drive(engine, workload, "bench", progress)
    extra = {
        "peak_kv_utilization": round(engine.peak_utilization, 4),
        "preemptions": int(engine.cache_stats()["preemptions"]) - preemptions_before,
    }
    return RunResult(requests, extra)


def _drive(engine: Engine, workload: Workload, tag: str, progress: bool) -> list[RequestMetrics]:
    specs = workload.requests
    order = (
        range(len(specs))
        if workload.sequential
        else sorted(range(len(specs)), key=lambda i: specs[i].arrival_s)
    )
    pending = deque(order)
    metrics: dict[str, RequestMetrics] = {}
    start = time.perf_counter()
    with tqdm(
        total=len(specs), desc=f"infer {workload.name}", unit="req", disable=not progress
    ) as bar:
        while pending or engine.has_unfinished_requests():
            now = time.perf_counter() - start
            while pending and _is_due(workload, specs[pending[0]].arrival_s, now, engine):
                index = pending[0]
                spec = specs[index]
                params = SamplingParams(
                    temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True
                )
                arrival = time.perf_counter() - start
                request_id = engine.add_request(
                    spec.prompt_token_ids, params, request_id=f"{tag}-{index}"
                )
                pending.popleft()
                metrics[request_id] = RequestMetrics(len(spec.prompt_token_ids), arrival)
            if not engine.has_unfinished_requests():
                if pending:  # idle until the next arrival
                    time.sleep(max(0.0, specs[pending[0]].arrival_s - now))
                continue
            for out in engine.step():
                if out.finished:
                    record = metrics[out.request_id]
                    record.token_times_s = list(out.token_times_s)
                    record.error = out.error
                    bar.update(1)
    return [metrics[f"{tag}-{i}"] for i in range(len(specs))]


def _is_due(workload: Workload, arrival_s: float, now: float, engine: Engine) -> bool:
    if workload.sequential:
        return not engine.has_unfinished_requests()
    return arrival_s <= now
