"""``infer serve`` on a GPU, with llama-3.2-3b's shapes: after a burst, a SIGTERM with streams
in flight finishes the short one, aborts the long ones after the grace period, and exits 0
with the engine process stopping when told (the "did not stop; killing it" warning was seen
only on GPU hosts, after benchmark runs)."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from tests.integration.conftest import started_stream

from infer.server.bridge.launch import spawn_server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SHUTDOWN_TIMEOUT_S = 5.0
BURST = 64


def _prompt(seed: int) -> list[int]:
    return [1000 + (seed * 37 + i) % 20000 for i in range(128)]


def test_sigterm_after_a_burst_drains_and_exits_0() -> None:
    args = ["--model", "llama-3.2-3b", "--load-format", "dummy", "--max-seq-len", "8192",
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]  # fmt: skip
    with spawn_server(args) as server:
        body = {"max_tokens": 64, "ignore_eos": True, "temperature": 1.0}

        def complete(seed: int) -> int:
            url = f"{server.url}/v1/completions"
            response = httpx.post(url, json={**body, "prompt": _prompt(seed)}, timeout=120)
            return response.status_code

        with ThreadPoolExecutor(BURST) as pool:
            assert set(pool.map(complete, range(BURST))) == {200}
        # Long enough to outlive the grace period at any decode speed.
        long = {"prompt": _prompt(BURST), "max_tokens": 6000, "ignore_eos": True}
        longs = [started_stream(server.url, long) for _ in range(2)]
        short, short_events = started_stream(
            server.url, {"prompt": _prompt(BURST + 1), "max_tokens": 4, "ignore_eos": True}
        )
        server.process.send_signal(signal.SIGTERM)
        short.join(timeout=30)
        assert '"finish_reason":"length"' in short_events[-2]
        for thread, events in longs:
            thread.join(timeout=60)
            assert events[-1] == "data: [DONE]"
            assert "shutting down" in events[-2]
        assert server.wait(timeout=60) == 0
    log = "".join(server.log)
    assert "aborting 2 in-flight sequences" in log
    assert "Traceback" not in log
    assert "did not stop" not in log
