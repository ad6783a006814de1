"""``/v1/cache/stats`` rates against the allocations counted over a timed window: nothing
once the window has passed without traffic (a server's first report once came out in the
trillions per second), then a burst's blocks over the stated window, read twice in a row
(the second once divided by the moment between them)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

# Three blocks of 16 tokens a request, in one engine step.
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4
REQUESTS = 2
ATTEMPTS = 3  # a burst that outlasts the window (a busy shared CPU) is tried again


def stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/cache/stats").json())


def burst(url: str) -> float:
    """``REQUESTS`` one-token completions at once; the seconds they took."""

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
            answers = await asyncio.gather(
                *(client.post("/v1/completions", json=body) for _ in range(REQUESTS))
            )
        assert [a.status_code for a in answers] == [200] * REQUESTS

    start = time.monotonic()
    asyncio.run(run())
    return time.monotonic() - start


def quiet_then_burst(url: str, window: float) -> dict[str, Any]:
    """The stats after a window without traffic (no rate at all), before a burst that fits
    in the window (all its allocations then count, over the window)."""
    for _ in range(ATTEMPTS):
        time.sleep(window + 0.5)
        before = stats(url)  # a server's first report once came out in the trillions
        assert before["allocs_per_s"] == before["frees_per_s"] == 0.0
        if burst(url) < window - 1:
            return before
    raise AssertionError(f"no burst of {ATTEMPTS} fitted in {window} s")


@pytest.mark.slow
def test_rates_are_the_counted_allocations_over_the_window(url: str) -> None:
    burst(url)  # a fresh server's first requests are slow
    window = stats(url)["rate_window_s"]
    assert window == 10.0
    for _ in range(2):
        before = quiet_then_burst(url, window)
        reads = [stats(url), stats(url)]
        allocated = reads[0]["total_allocations"] - before["total_allocations"]
        freed = reads[0]["total_frees"] - before["total_frees"]
        assert allocated >= 3 * REQUESTS and freed == allocated
        for read in reads:
            assert read["allocs_per_s"] == pytest.approx(allocated / window)
            assert read["frees_per_s"] == pytest.approx(freed / window)
            assert read["total_allocations"] == reads[0]["total_allocations"]  # monotonic
