"""``Retry-After`` at 10x load: 40 clients retry on 503 as told against a server that holds
4 sequences (the stand-in engine: a fixed step time, so the rate is the server's, not the
CPU's). The median client must be served within 2x of the sum of the waits it was told, and
no sooner than half of it: the header is neither too optimistic (clients come back to be
refused again) nor too pessimistic (they wait on an idle server)."""

from __future__ import annotations

import asyncio

from infer import EngineConfig
from infer.bench.retrying_clients import run_clients, summarise
from infer.server.bridge.standin_server import standin_server

CLIENTS = 40
BODY = {"prompt": "Hello", "max_tokens": 10}


def test_the_median_client_is_served_within_twice_the_waits_it_was_told() -> None:
    config = EngineConfig(
        model="smollm2-135m", device="cpu", max_batch_size=2, max_waiting_requests=2
    )
    with standin_server(config, step_s=0.05) as url:  # 0.5 s a request, 2 at a time
        runs = asyncio.run(run_clients(url, CLIENTS, BODY))
    summary = summarise(runs)
    assert summary.served == CLIENTS, summary
    assert summary.median_told > 0, summary  # the median client was refused
    assert 0.5 <= summary.median_seconds / summary.median_told <= 2.0, summary
    assert 0.5 <= summary.median_ratio <= 2.0, summary
