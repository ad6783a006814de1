"""Runs a workload through an engine in-process, honouring arrival times.

``LLM.generate`` hands the engine a whole batch at once; a workload with staggered arrivals
needs requests added while others run: ``run_workload`` drives the engine with the loop
every caller uses (``engine/loop.py``), its feed adding each request when its arrival time
has come (or, for sequential workloads, when the previous one has finished). It drives
``infer``'s engine (``run_infer``) and the vLLM peer (``infer.bench.vllm_peer``) alike,
through ``BenchEngine``.

For ``infer``, TTFT and ITL come from the engine's own token timestamps
(``RequestOutput.token_times_s``, relative to when the request was added).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from tqdm import tqdm

from infer.bench.metrics import RequestMetrics, RunResult
from infer.bench.sampling import GREEDY, BenchSampling
from infer.contract.outputs import RequestOutput
from infer.engine.core.engine import Engine
from infer.engine.loop import SteppedEngine, drive
from infer.heap import frozen_heap
from infer.workloads import RequestSpec, Workload


class BenchEngine(SteppedEngine[Any], Protocol):
    """What ``run_workload`` needs of an engine: add a request, run a step, record its
    outputs."""

    def add(self, request_id: str, spec: RequestSpec) -> None:
        """Queue one request (the run's sampling settings, EOS ignored)."""
        ...

    def record(
        self, outputs: Sequence[Any], requests: dict[str, RequestMetrics], start: float
    ) -> int:
        """Fill in the token times (and errors) of ``requests`` from one step's outputs;
        returns how many requests finished. ``start`` is the run's (``time.perf_counter``)."""
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
        run_workload(stepped, warmup, "warmup", progress=False)
    engine.peak_utilization = 0.0
    preemptions_before = int(engine.cache_stats()["preemptions"])
    speculation_before = replace(engine.scheduler.speculation)
    requests = run_workload(stepped, workload, "bench", progress)
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

    @property
    def stalled(self) -> bool:
        return self.engine.stalled

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def wait_to_schedule(self) -> None:
        self.engine.wait_to_schedule()

    def add(self, request_id: str, spec: RequestSpec) -> None:
        params = self.sampling.params(spec.max_tokens)
        self.engine.add_request(spec.prompt_token_ids, params, request_id=request_id)

    def step(self) -> list[RequestOutput]:
        return self.engine.step()

    def record(
        self, outputs: Sequence[RequestOutput], requests: dict[str, RequestMetrics], start: float
    ) -> int:
        finished = 0
        for out in outputs:
            if out.finished:
                record = requests[out.request_id]
                record.token_times_s = list(out.token_times_s)
                record.error = out.error
                finished += 1
        return finished


class _Arrivals:
    """The benchmark's ``Feed``: adds each request of a workload when it is due (or, for a
    sequential workload, when the one before has finished) and records what comes out.
    Request ids are ``<tag>-<index>``."""

    def __init__(self, engine: BenchEngine, workload: Workload, tag: str, bar: tqdm) -> None:
        self.engine = engine
        self.workload = workload
        self.tag = tag
        self.bar = bar
        specs = workload.requests
        order = (
            range(len(specs))
            if workload.sequential
            else sorted(range(len(specs)), key=lambda i: specs[i].arrival_s)
        )
        self.pending = deque(order)
        self.metrics: dict[str, RequestMetrics] = {}
        self.start = time.perf_counter()

    def may_take_in(self) -> bool:
        return bool(self.pending) and not self.workload.sequential

    def take_in(self, idle: bool) -> bool:
        engine, specs, pending = self.engine, self.workload.requests, self.pending
        if not pending and not engine.has_unfinished_requests():
            return False
        now = time.perf_counter() - self.start
        while pending and self._is_due(specs[pending[0]].arrival_s, now):
            index = pending.popleft()
            spec = specs[index]
            request_id = f"{self.tag}-{index}"
            arrival = time.perf_counter() - self.start
            engine.add(request_id, spec)
            waited = 0.0 if self.workload.sequential else max(0.0, arrival - spec.arrival_s)
            self.metrics[request_id] = RequestMetrics(
                len(spec.prompt_token_ids), arrival, due_wait_s=waited
            )
        if pending and not engine.has_unfinished_requests():  # idle until the next arrival
            time.sleep(max(0.0, specs[pending[0]].arrival_s - now))
        return True

    def _is_due(self, arrival_s: float, now: float) -> bool:
        if self.workload.sequential:
            return not self.engine.has_unfinished_requests()
        return arrival_s <= now

    def put_out(self, outputs: Sequence[Any]) -> None:
        self.bar.update(self.engine.record(outputs, self.metrics, self.start))


def run_workload(
    engine: BenchEngine,
    workload: Workload,
    tag: str,
    progress: bool,
    label: str = "infer",
) -> list[RequestMetrics]:
    """Add every request of ``workload`` when it is due and step ``engine`` until all have
    finished; the measured loop runs with the start-up heap frozen (as the server's engine
    process does, ``infer.heap``). Request ids are ``<tag>-<index>``."""
    total = len(workload.requests)
    with (
        frozen_heap(),
        tqdm(total=total, desc=f"{label} {workload.name}", unit="req", disable=not progress) as bar,
    ):
        arrivals = _Arrivals(engine, workload, tag, bar)
        drive(engine, arrivals)
    return [arrivals.metrics[f"{tag}-{i}"] for i in range(total)]
