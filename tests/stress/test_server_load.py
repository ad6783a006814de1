"""The server under load: 64 concurrent streams with a third cancelled at random points,
and a burst beyond capacity that must see 503s and lose nothing.

The module's server holds at most max_batch_size + max_waiting_requests = 16 + 48 = 64
unfinished sequences; everything beyond that is refused at once with 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer import EngineConfig
from infer.server import build_server, serve_in_thread

MAX_BATCH, MAX_WAITING = 16, 48
CAPACITY = MAX_BATCH + MAX_WAITING
MAX_TOKENS = 24
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The best way to learn a language is",
    "Water boils at",
    "My favourite food is",
    "The three primary colours are",
    "In 1969, astronauts",
]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    config = EngineConfig(
        model="smollm2-135m",
        device="cpu",
        num_gpu_blocks=512,
        max_seq_len=512,
        max_batch_size=MAX_BATCH,
        max_waiting_requests=MAX_WAITING,
    )
    with serve_in_thread(build_server(config, port=0, log_level="warning")) as base_url:
        yield base_url


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


async def wait_until_idle(http: httpx.AsyncClient, timeout: float = 30.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        stats: dict[str, Any] = (await http.get("/v1/cache/stats")).json()
        if stats["used_blocks"] == 0 and stats["active_sequences"] == 0:
            return stats
        assert loop.time() < deadline, stats
        await asyncio.sleep(0.05)


def test_64_streams_with_a_third_cancelled(url: str) -> None:
    rng = random.Random(1234)
    cancel_after = {i: rng.randrange(0, MAX_TOKENS) for i in rng.sample(range(64), 21)}
    before = metrics(url)

    async def run() -> tuple[dict[str, str], list[tuple[str, str | None] | None]]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        answers = await asyncio.gather(
            *(
                client.completions.create(prompt=p, model="smollm2-135m",
                                          max_tokens=MAX_TOKENS, temperature=0)
                for p in PROMPTS
            )
        )  # fmt: skip
        expected = {p: a.choices[0].text for p, a in zip(PROMPTS, answers)}

        async def one(i: int) -> tuple[str, str | None] | None:
            stream = await client.completions.create(
                prompt=PROMPTS[i % len(PROMPTS)],
                model="smollm2-135m",
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
            )
            text, finish, chunks = "", None, 0
            async for chunk in stream:
                if chunks == cancel_after.get(i):
                    await stream.close()  # the client goes away mid-stream
                    return None
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason
                chunks += 1
            return text, finish

        results = await asyncio.gather(*(one(i) for i in range(64)))
        return expected, results

    expected, results = asyncio.run(run())
    cancelled = [i for i, r in enumerate(results) if r is None]
    assert len(cancelled) >= 15  # some cancel points lie past an early end of text
    for i, result in enumerate(results):
        if result is not None:
            text, finish = result
            assert text == expected[PROMPTS[i % len(PROMPTS)]], i
            assert finish in ("stop", "length")

    async def check() -> None:
        async with httpx.AsyncClient(base_url=url) as http:
            stats = await wait_until_idle(http)
            assert stats["leaked_blocks"] == 0 and stats["used_blocks"] == 0
            assert (await http.get("/health")).json() == {"status": "ok"}

    asyncio.run(check())
    after = metrics(url)
    assert after["infer_num_requests_running"] == 0 and after["infer_num_requests_waiting"] == 0
    finished = {
        reason: after.get(f"infer_request_finished_total{{finish_reason={reason}}}", 0.0)
        - before.get(f"infer_request_finished_total{{finish_reason={reason}}}", 0.0)
        for reason in ("abort", "stop", "length")
    }
    assert sum(finished.values()) == len(PROMPTS) + 64  # every sequence ended exactly once
    # A client may close after the server sent its last chunk: that one is not an abort.
    assert 0 < finished["abort"] <= len(cancelled)


def test_burst_beyond_capacity_gets_503s_and_loses_nothing(url: str) -> None:
    num_requests = CAPACITY + CAPACITY // 2
    bodies = [
        {"prompt": f"Request number {i}:", "max_tokens": 16, "ignore_eos": True, "temperature": 0}
        for i in range(num_requests)
    ]

    async def run() -> tuple[list[int], dict[int, dict[str, Any]]]:
        limits = httpx.Limits(max_connections=2 * num_requests)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as http:

            async def send(i: int) -> tuple[int, httpx.Response]:
                return i, await http.post("/v1/completions", json=bodies[i])

            done: dict[int, dict[str, Any]] = {}
            rejected_first: list[int] = []
            pending = list(range(num_requests))
            for attempt in range(20):
                responses = await asyncio.gather(*(send(i) for i in pending))
                pending, retry_after = [], 0
                for i, response in responses:
                    if response.status_code == 503:
                        assert response.json()["error"]["code"] == "queue_full"
                        retry_after = int(response.headers["Retry-After"])
                        pending.append(i)
                    else:
                        assert response.status_code == 200, response.text
                        assert i not in done
                        done[i] = response.json()
                if attempt == 0:
                    rejected_first = list(pending)
                if not pending:
                    break
                assert retry_after >= 1
                await asyncio.sleep(retry_after)
            stats = await wait_until_idle(http)
            assert stats["leaked_blocks"] == 0
            assert (await http.get("/health")).status_code == 200
            return rejected_first, done

    rejected, done = asyncio.run(run())
    assert rejected  # the burst hit the bound
    assert sorted(done) == list(range(num_requests))  # every request eventually completed
    for body in done.values():
        assert body["usage"]["completion_tokens"] == 16
        assert body["choices"][0]["finish_reason"] == "length"
