"""The router's workers: their URLs, the routing policy over them, and their health.

Every ``health_interval`` seconds each worker's ``GET /health`` is asked (within
``health_timeout``): a worker that fails it (an error status, no answer) leaves rotation,
and one that passes rejoins. A healthy worker's ``/metrics`` tells its load: the requests it
runs or queues beyond those the router has in flight there (other clients') and its KV use.
A request that cannot reach a worker takes it out of rotation at once, without waiting for
the next probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from infer.routing import CacheAwarePolicy, RoutingSettings

logger = logging.getLogger(__name__)

DEFAULT_HEALTH_INTERVAL_S = 2.0
DEFAULT_HEALTH_TIMEOUT_S = 5.0

_LOAD_GAUGES = ("infer_num_requests_running", "infer_num_requests_waiting")
_KV_GAUGE = "infer_kv_cache_usage_ratio"


def worker_url(url: str) -> str:
    """``url`` as the router names a worker: ``http(s)://host[:port][/prefix]``, without a
    trailing slash (``ValueError`` naming the field ``url``)."""
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"url: not a URL: {url!r} ({exc})") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"url: must be http(s)://host[:port], got {url!r}")
    if parsed.query or parsed.fragment:
        raise ValueError(f"url: must have no query or fragment, got {url!r}")
    return str(parsed).rstrip("/")


@dataclass(frozen=True)
class WorkerReport:
    """One worker as ``GET /workers`` and ``/metrics`` show it."""

    url: str
    healthy: bool
    in_flight: int
    routed: int
    routed_by_prefix: int
    failures: int
    cached_blocks: int
    kv_usage: float | None


class WorkerPool:
    """The workers behind the router. ``policy`` routes among the healthy ones; ``client``
    is the HTTP client every request and probe goes through."""

    def __init__(
        self,
        urls: list[str],
        client: httpx.AsyncClient,
        settings: RoutingSettings,
        health_interval: float = DEFAULT_HEALTH_INTERVAL_S,
        health_timeout: float = DEFAULT_HEALTH_TIMEOUT_S,
    ) -> None:
        if health_interval <= 0:
            raise ValueError(f"health_interval: must be > 0 seconds, got {health_interval}")
        if health_timeout <= 0:
            raise ValueError(f"health_timeout: must be > 0 seconds, got {health_timeout}")
        self.client = client
        self.policy = CacheAwarePolicy(settings)
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.failures: Counter[str] = Counter()
        for url in urls:
            self.add(url, healthy=False)  # until its first probe

    @property
    def urls(self) -> list[str]:
        return [state.name for state in self.policy.workers()]

    def add(self, url: str, *, healthy: bool = False) -> str:
        """Add a worker (out of rotation until ``probe`` finds it healthy, unless
        ``healthy``); returns its normalised URL."""
        name = worker_url(url)
        if name in self.urls:
            raise ValueError(f"url: {name} is a worker already")
        self.policy.add_worker(name, healthy=healthy)
        return name

    def remove(self, url: str) -> str:
        """Remove a worker (``LookupError`` if it is none); its requests in flight go on."""
        name = worker_url(url)
        if name not in self.urls:
            raise LookupError(f"url: {name} is not a worker")
        self.policy.remove_worker(name)
        self.failures.pop(name, None)
        return name

    def failed(self, url: str, *, unreachable: bool) -> None:
        """A request failed at ``url``; ``unreachable``: the worker could not be reached or
        dropped the connection, so it leaves rotation until a probe finds it healthy."""
        self.failures[url] += 1
        if unreachable and self.policy.set_healthy(url, False):
            logger.warning("worker %s is unreachable; out of rotation", url)

    def reports(self) -> list[WorkerReport]:
        return [
            WorkerReport(
                s.name,
                s.healthy,
                s.in_flight,
                s.routed,
                s.routed_by_prefix,
                self.failures[s.name],
                s.cached_blocks,
                s.kv_usage,
            )
            for s in self.policy.workers()
        ]

    async def probe(self, url: str) -> bool:
        """Ask the worker's health (and, if healthy, its load); True if it is healthy."""
        try:
            answer = await self.client.get(f"{url}/health", timeout=self.health_timeout)
            healthy = answer.status_code == 200
        except httpx.HTTPError:
            healthy = False
        if self.policy.set_healthy(url, healthy):
            if healthy:
                logger.info("worker %s is healthy; in rotation", url)
            else:
                logger.warning("worker %s is unhealthy; out of rotation", url)
        if healthy:
            await self._read_load(url)
        return healthy

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(url) for url in self.urls))

    async def poll_forever(self) -> None:
        """Probe every worker every ``health_interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.health_interval)
            try:
                await self.probe_all()
            except Exception:  # a poller that died would never let a worker rejoin
                logger.exception("probing the workers failed; trying again")

    async def _read_load(self, url: str) -> None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            answer = await self.client.get(f"{url}/metrics", timeout=self.health_timeout)
            if answer.status_code != 200:
                return
            gauges = {
                family.name: family.samples[0].value
                for family in text_string_to_metric_families(answer.text)
                if family.name in (*_LOAD_GAUGES, _KV_GAUGE) and family.samples
            }
            in_flight = next((s.in_flight for s in self.policy.workers() if s.name == url), 0)
            requests = sum(int(gauges.get(name, 0)) for name in _LOAD_GAUGES)
            self.policy.report_load(
                url, other_requests=requests - in_flight, kv_usage=gauges.get(_KV_GAUGE)
            )
