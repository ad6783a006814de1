"""``infer router`` (a real process) in front of two real ``infer serve``s of SmolLM2: the
session's server and one more. Requests sharing a prefix reach the worker that caches it,
and what the workers answer reaches the client unchanged."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from infer.server import build_server, serve_in_thread
from infer.server.bridge.launch import ServerProcess, spawn_server

MODEL = "smollm2-135m"
# A second SmolLM2 server and the router's process: about 50 s of CPU, more than make
# test's budget allows (its stand-in tests, tests/unit/router/, run there).
pytestmark = pytest.mark.stress


@pytest.fixture(scope="module")
def second_url(smollm2_config: Any) -> Iterator[str]:
    server = build_server(smollm2_config, port=0, log_level="warning")
    with serve_in_thread(server) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def router(url: str, second_url: str) -> Iterator[ServerProcess]:
    args = ["--worker", url, "--worker", second_url, "--health-interval", "0.5"]
    with spawn_server(args, startup_timeout=120, subcommand="router") as process:
        yield process


def _prefix_hits(url: str) -> tuple[int, int]:
    stats = httpx.get(f"{url}/v1/cache/stats").json()
    return stats["prefix_hits"], stats["prefix_queries"]


def test_requests_sharing_a_prefix_hit_the_cache_of_one_worker(
    router: ServerProcess, url: str, second_url: str
) -> None:
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    system = f"{uuid.uuid4()} You are a careful assistant. " + "Answer in one word. " * 40
    before = {u: _prefix_hits(u) for u in (url, second_url)}
    for question in ("Red?", "Blue?", "Green?", "Gold?"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=2,
        )
    gained = {u: (h - before[u][0], q - before[u][1]) for u, (h, q) in
              ((u, _prefix_hits(u)) for u in (url, second_url))}  # fmt: skip
    served = [u for u, (_, queries) in gained.items() if queries > 0]
    assert len(served) == 1, gained  # all four on one worker
    hits, _ = gained[served[0]]
    # the three after the first reuse the system prompt's blocks (about ten of them)
    assert hits >= 3 * 8, gained
    workers = httpx.get(f"{router.url}/workers").json()["workers"]
    assert sum(w["routed_by_prefix"] for w in workers) >= 3


def test_streams_and_errors_come_back_as_the_worker_sent_them(
    router: ServerProcess, url: str
) -> None:
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=4, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    bad = {"model": MODEL, "prompt": "x", "max_tokens": -1}
    direct = httpx.post(f"{url}/v1/completions", json=bad)
    routed = httpx.post(f"{router.url}/v1/completions", json=bad)
    assert (routed.status_code, routed.content) == (direct.status_code, direct.content)
    assert routed.status_code == 400
    assert httpx.get(f"{router.url}/health").json()["healthy_workers"] == 2
