"""Prometheus metrics of the server (``GET /metrics``).

Engine gauges and counters are read from the snapshot the engine thread publishes after
every step, so scraping never races the engine. With several data-parallel replicas they
are the replicas' total, and ``infer_replica_*`` gives each one's, labelled ``replica``
(whether it serves, its own counters, the requests this API process routed to it).
Latency histograms are observed when a request ends, from the arrival times of its tokens at
the event loop (what clients see), all of a sequence's inter-token latencies in one pass
(``observe_all``).

A server with several API processes (``bridge/api_workers.py``) keeps its histograms and counters
in prometheus_client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, set before
prometheus_client is imported: ``infer serve`` does), and every process's ``/metrics``
shows the sum of all of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from infer.contract.messages import EngineSnapshot
from infer.server.bridge.engine_client import Job
from infer.server.bridge.replica_totals import ReplicaReport

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class _EngineCollector(Collector):
    def __init__(self, snapshot: Callable[[], EngineSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield GaugeMetricFamily(
            "infer_num_requests_running", "Sequences in the running batch.", s.num_running
        )
        yield GaugeMetricFamily(
            "infer_num_requests_waiting", "Sequences waiting to be scheduled.", s.num_waiting
        )
        yield GaugeMetricFamily(
            "infer_kv_cache_usage_ratio", "Fraction of KV cache blocks in use.", s.kv_usage
        )
        yield CounterMetricFamily(
            "infer_num_preemptions", "Sequences preempted for lack of cache.", s.preemptions
        )
        yield CounterMetricFamily(
            "infer_prompt_tokens", "Prompt tokens computed (prefill).", s.prompt_tokens
        )
        yield CounterMetricFamily(
            "infer_generation_tokens", "Tokens generated.", s.generation_tokens
        )
        yield CounterMetricFamily(
            "infer_structured_output_errors",
            "Constrained sequences ended by an error of their grammar's matcher (a sampled "
            "token it could not consume, a mask beyond llguidance's limits).",
            s.structured_output_errors,
        )
        spec = s.speculation
        yield CounterMetricFamily(
            "infer_spec_decode_num_drafts",
            "Speculative decoding: rows whose proposed tokens a step checked.",
            spec.num_verify_steps,
        )
        yield CounterMetricFamily(
            "infer_spec_decode_num_draft_tokens", "Tokens proposed.", spec.num_draft_tokens
        )
        yield CounterMetricFamily(
            "infer_spec_decode_num_accepted_tokens",
            "Proposed tokens the model agreed with.",
            spec.num_accepted_tokens,
        )
        yield GaugeMetricFamily(
            "infer_spec_decode_acceptance_rate",
            "Accepted of proposed tokens, since start.",
            spec.acceptance_rate,
        )
        yield GaugeMetricFamily(
            "infer_spec_decode_mean_accepted_length",
            "Tokens a checked row produced per step (its own sample included), since start.",
            spec.mean_accepted_length,
        )
        by_position = CounterMetricFamily(
            "infer_spec_decode_num_accepted_tokens_per_pos",
            "Proposed tokens the model agreed with, by position among a row's proposals.",
            labels=["position"],
        )
        for position, count in enumerate(spec.accepted_by_position):
            by_position.add_metric([str(position)], count)
        yield by_position


class _ReplicaCollector(Collector):
    """Each replica's figures, when there are several."""

    def __init__(self, reports: Callable[[], list[ReplicaReport]]) -> None:
        self._reports = reports

    def collect(self) -> Iterator[Metric]:
        reports = self._reports()
        if len(reports) < 2:
            return
        families = [
            (GaugeMetricFamily, "up", "Whether the replica serves (0: it failed, out of "
             "rotation).", lambda r: r.error is None),
            (GaugeMetricFamily, "num_requests_running", "Sequences in its running batch.",
             lambda r: r.snapshot.num_running),
            (GaugeMetricFamily, "num_requests_waiting", "Sequences waiting there.",
             lambda r: r.snapshot.num_waiting),
            (GaugeMetricFamily, "kv_cache_usage_ratio", "Fraction of its KV cache blocks in "
             "use.", lambda r: r.snapshot.kv_usage),
            (CounterMetricFamily, "prompt_tokens", "Prompt tokens it computed (prefill).",
             lambda r: r.snapshot.prompt_tokens),
            (CounterMetricFamily, "generation_tokens", "Tokens it generated.",
             lambda r: r.snapshot.generation_tokens),
            (CounterMetricFamily, "routed_requests", "Sequences this API process routed "
             "to it.", lambda r: r.routed),
            (CounterMetricFamily, "routed_by_prefix", "Of which for the prompt prefix it "
             "was believed to cache.", lambda r: r.routed_by_prefix),
        ]  # fmt: skip
        for kind, name, documentation, value in families:
            family = kind(f"infer_replica_{name}", documentation, labels=["replica"])
            for report in reports:
                family.add_metric([str(report.index)], float(value(report)))
            yield family


class ServerMetrics:
    """A registry per server, so several apps (tests) can live in one process."""

    def __init__(
        self,
        snapshot: Callable[[], EngineSnapshot],
        replicas: Callable[[], list[ReplicaReport]] | None = None,
    ) -> None:
        """``replicas``: each data-parallel replica's figures (None: one engine)."""
        self.registry = CollectorRegistry()
        self._engine = _EngineCollector(snapshot)
        self.registry.register(self._engine)
        self._replicas = None if replicas is None else _ReplicaCollector(replicas)
        if self._replicas is not None:
            self.registry.register(self._replicas)
        self.ttft = Histogram(
            "infer_time_to_first_token_seconds",
            "Request arrival to its first token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "infer_inter_token_latency_seconds",
            "Time between consecutive tokens of a sequence.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "infer_e2e_request_latency_seconds",
            "Request arrival to its last token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.finished = Counter(
            "infer_request_finished",
            "Finished sequences by finish reason (abort: cancelled, timed out or shut down).",
            ["finish_reason"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "infer_request_rejected",
            "Requests refused before reaching the engine, by HTTP status.",
            ["status"],
            registry=self.registry,
        )

    def observe(self, job: Job) -> None:
        """Record the latencies of a job's sequences (called once, when it closes)."""
        for times, reason in zip(job.token_times, job.finish_reasons):
            if times:
                self.ttft.observe(times[0] - job.submitted)
                observe_all(self.itl, np.diff(times))
            if reason is not None and times:
                self.e2e.observe(times[-1] - job.submitted)
            self.finished.labels(reason or "abort").inc()

    def render(self) -> bytes:
        if not shared_between_processes():
            return generate_latest(self.registry)
        every_process = CollectorRegistry()
        MultiProcessCollector(every_process)
        every_process.register(self._engine)
        if self._replicas is not None:
            every_process.register(self._replicas)
        return generate_latest(every_process)


def observe_all(histogram: Histogram, amounts: np.ndarray) -> None:
    """``histogram.observe(a)`` for each ``a`` (of a histogram without labels), in one pass.

    prometheus_client observes one value per call; at the end of a burst hundreds of
    streams close within a few steps, and observing their inter-token latencies one by one
    held the event loop (and the last tokens) back. Here each bucket gets its count at once
    (where ``observe`` puts a value: the first bucket whose upper bound is not below it)."""
    if amounts.size == 0:
        return
    bounds = histogram._upper_bounds  # no public way to add counts
    counts = np.bincount(np.searchsorted(bounds, amounts), minlength=len(bounds))
    for bucket, count in zip(histogram._buckets, counts.tolist(), strict=True):
        if count:
            bucket.inc(count)
    histogram._sum.inc(float(amounts.sum()))


def shared_between_processes() -> bool:
    """Whether histograms and counters go to the multiprocess files (see the module's
    docstring)."""
    return bool(os.environ.get(MULTIPROCESS_DIR))
