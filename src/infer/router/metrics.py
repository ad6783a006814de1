"""The router's ``GET /metrics`` (Prometheus text): per worker, requests routed (by prefix
or by load), in flight, failed, its health, and the size of its prefix view."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infer.router.workers import WorkerPool


class _WorkerCollector(Collector):
    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        reports = self._pool.reports()
        routed = CounterMetricFamily(
            "infer_router_requests_routed",
            "Requests routed to the worker, by why (prefix: the prompt's cached prefix; "
            "load: the least loaded).",
            labels=["worker", "reason"],
        )
        in_flight = GaugeMetricFamily(
            "infer_router_requests_in_flight", "Requests at the worker now.", labels=["worker"]
        )
        failures = CounterMetricFamily(
            "infer_router_worker_failures",
            "Requests the worker failed: unreachable, a dropped connection, or a 5xx status.",
            labels=["worker"],
        )
        healthy = GaugeMetricFamily(
            "infer_router_worker_healthy", "1 while the worker is in rotation.", labels=["worker"]
        )
        cached = GaugeMetricFamily(
            "infer_router_prefix_blocks",
            "Block hashes in the router's view of the worker's prefix cache.",
            labels=["worker"],
        )
        for r in reports:
            routed.add_metric([r.url, "prefix"], r.routed_by_prefix)
            routed.add_metric([r.url, "load"], r.routed - r.routed_by_prefix)
            in_flight.add_metric([r.url], r.in_flight)
            failures.add_metric([r.url], r.failures)
            healthy.add_metric([r.url], int(r.healthy))
            cached.add_metric([r.url], r.cached_blocks)
        yield from (routed, in_flight, failures, healthy, cached)


def router_metrics(pool: WorkerPool) -> CollectorRegistry:
    """A registry of the pool's metrics (one per app, so tests can hold several)."""
    registry = CollectorRegistry()
    registry.register(_WorkerCollector(pool))
    return registry
