"""Clients that retry on 503 as ``Retry-After`` tells them, all at once: how long each took
to be served, how often it was refused, and the waits it was told (the 10x-load check of
``Retry-After``: ``benchmarks/retry_after_load.py`` and its stress test).

A client whose request the server refused sleeps exactly the ``Retry-After`` it was given
(an HTTP date is not expected) and sends it again, up to ``max_attempts`` times.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class ClientRun:
    """One client: seconds from its first attempt to its answer (None: it gave up), and the
    ``Retry-After`` values it was told."""

    seconds: float | None = None
    waits: list[int] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    attempts: list[float] = field(default_factory=list)  # seconds from the first, each sent

    @property
    def told(self) -> int:
        """The sum of the ``Retry-After`` values it was given."""
        return sum(self.waits)


async def _client(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], max_attempts: int
) -> ClientRun:
    run = ClientRun()
    start = time.monotonic()
    for _ in range(max_attempts):
        run.attempts.append(time.monotonic() - start)
        response = await http.post(f"{url}/v1/completions", json=body)
        run.statuses.append(response.status_code)
        if response.status_code != 503:
            if response.status_code == 200:
                run.seconds = time.monotonic() - start
            return run
        wait = int(response.headers["Retry-After"])
        run.waits.append(wait)
        await asyncio.sleep(wait)
    return run


async def run_clients(
    url: str, clients: int, body: dict[str, Any], max_attempts: int = 1000
) -> list[ClientRun]:
    """``clients`` clients sending ``body`` to ``/v1/completions`` at once, each on
    connections of its own, retrying each 503 after its ``Retry-After``."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        runs = [_client(http, url, body, max_attempts) for _ in range(clients)]
        return list(await asyncio.gather(*runs))


@dataclass(frozen=True)
class LoadSummary:
    served: int
    clients: int
    median_seconds: float
    median_told: float  # the median client's (by seconds) sum of Retry-After values
    median_retries: float
    max_retries: int
    median_ratio: float  # of seconds to the sum told, over the clients refused at least once

    def __str__(self) -> str:
        return (
            f"{self.served}/{self.clients} served; median client {self.median_seconds:.1f} s "
            f"after being told {self.median_told:.0f} s in all; retries median "
            f"{self.median_retries:.0f}, max {self.max_retries}; median seconds/told "
            f"{self.median_ratio:.2f}"
        )


def summarise(runs: list[ClientRun]) -> LoadSummary:
    served = sorted((r for r in runs if r.seconds is not None), key=lambda r: r.seconds or 0.0)
    median = served[len(served) // 2]
    refused = [r for r in served if r.waits]
    ratios = [(r.seconds or 0.0) / r.told for r in refused]
    return LoadSummary(
        served=len(served),
        clients=len(runs),
        median_seconds=median.seconds or 0.0,
        median_told=median.told,
        median_retries=statistics.median(len(r.waits) for r in runs),
        max_retries=max(len(r.waits) for r in runs),
        median_ratio=statistics.median(ratios) if ratios else 0.0,
    )
