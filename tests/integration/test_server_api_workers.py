"""``infer serve --api-server-count 2``: two API processes in front of one engine. Both take
requests, the capacity is the server's (not each process's), ``/metrics`` adds both up,
a cancelled stream frees its blocks, and SIGTERM stops the whole server cleanly (the last
test of the module: it ends the shared server)."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from infer.server.bridge.launch import ServerProcess, spawn_server

MAX_BATCH = 2
MAX_WAITING = 2
CAPACITY = MAX_BATCH + MAX_WAITING
QUESTION = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def metrics_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="infer-test-metrics-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def server(metrics_dir: Path) -> Iterator[ServerProcess]:
    args = [
        "--model", "smollm2-135m", "--device", "cpu", "--num-gpu-blocks", "512",
        "--max-seq-len", "2048", "--max-batch-size", str(MAX_BATCH),
        "--max-waiting-requests", str(MAX_WAITING), "--api-server-count", "2",
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as env:  # the server keeps its metrics where we look
        env.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
        with spawn_server(args) as process:
            yield process


def _complete(url: str, body: dict[str, object]) -> httpx.Response:
    with httpx.Client(timeout=120) as client:  # a connection of its own for each request
        return client.post(f"{url}/v1/completions", json=body)


def _finished_by_process(metrics_dir: Path) -> list[float]:
    """Finished sequences counted by each API process (one counter file each)."""
    counts = []
    for path in sorted(metrics_dir.glob("counter_*.db")):
        alone = Path(tempfile.mkdtemp(dir=metrics_dir.parent))
        try:
            shutil.copy(path, alone)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(alone))
            value = registry.get_sample_value(
                "infer_request_finished_total", {"finish_reason": "length"}
            )
            counts.append(value or 0.0)
        finally:
            shutil.rmtree(alone)
    return counts


def test_both_processes_serve_and_metrics_add_them_up(
    server: ServerProcess, metrics_dir: Path
) -> None:
    requests = 24  # on separate connections: the kernel spreads them over both sockets
    with ThreadPoolExecutor(CAPACITY - 1) as pool:  # never more than the server holds
        responses = list(pool.map(lambda _: _complete(server.url, QUESTION), range(requests)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    texts = {r.json()["choices"][0]["text"] for r in responses}
    assert len(texts) == 1 and "Paris" in texts.pop()  # greedy: the same answer from both

    per_process = _finished_by_process(metrics_dir)
    assert sum(per_process) == requests
    assert len([count for count in per_process if count]) == 2, per_process
    scraped = httpx.get(f"{server.url}/metrics").text  # from either process: the sum
    assert f'infer_request_finished_total{{finish_reason="length"}} {requests}.0' in scraped


def test_capacity_is_the_servers_not_each_processes(server: ServerProcess) -> None:
    """Twelve streams at once: the server holds CAPACITY of them (each process alone would
    take CAPACITY); they stay open until every status is known, then cancelling them frees
    their blocks."""
    long = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    everyone_answered = threading.Barrier(12)

    def open_stream(_: int) -> tuple[int, str]:
        url = f"{server.url}/v1/completions"
        with httpx.Client(timeout=120) as client, client.stream("POST", url, json=long) as response:
            body = "" if response.status_code == 200 else response.read().decode()
            everyone_answered.wait(timeout=120)
            return response.status_code, body

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(open_stream, range(12)))
    statuses = sorted(status for status, _ in answers)
    # Lock-free counts may let two processes overshoot by a request reserved at the same
    # instant.
    assert CAPACITY <= statuses.count(200) <= CAPACITY + 1, statuses
    assert set(statuses) == {200, 503}
    refused = next(body for status, body in answers if status == 503)
    assert json.loads(refused)["error"]["code"] == "queue_full"
    deadline = time.monotonic() + 30
    while (stats := httpx.get(f"{server.url}/v1/cache/stats").json())["used_blocks"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    assert stats["leaked_blocks"] == 0


def test_sigterm_stops_every_process(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) in (0, -signal.SIGTERM)
    log = "".join(server.log)
    assert "did not stop" not in log and "killing" not in log, log[-3000:]
    assert "Application shutdown complete" in log
