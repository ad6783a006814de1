"""Hostile input beside good traffic: while good streams run, every sampling field is sent
with out-of-range and wrongly typed values (each must get a 400 naming the field) and
with its valid edge values (each must succeed). The good streams produce exactly the
tokens they produce alone, the engine keeps serving, and no KV block leaks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer import EngineConfig
from infer.server import build_server, serve_in_thread

VOCAB = 49152  # SmolLM2
MAX_SEQ_LEN = 512
QUESTION = [{"role": "user", "content": "Name a colour."}]

GOOD: list[tuple[str, dict[str, Any]]] = [
    ("completions", {"prompt": "The capital of France is", "temperature": 0}),
    ("completions", {"prompt": "def fibonacci(n):", "temperature": 0.8, "seed": 11}),
    ("completions", {"prompt": "Once upon a time", "temperature": 0, "n": 2}),
    ("completions", {"prompt": "Water boils at", "temperature": 1.0, "top_k": 20, "seed": 3,
                     "min_tokens": 8, "presence_penalty": 0.5}),
    ("chat/completions", {"messages": QUESTION, "temperature": 0}),
    ("chat/completions", {"messages": QUESTION, "temperature": 0.7, "top_p": 0.9, "seed": 5}),
]  # fmt: skip

INFINITY = "Infinity"  # written into the JSON text as the bare token
INVALID: dict[str, list[Any]] = {
    "n": [0, -1, 129, 2**64, "1", 1.5, True],
    "temperature": [-0.1, 2.01, 1e9, 1e309, INFINITY, "NaN", "0", [0]],
    "top_p": [0, -1, 1.0001, INFINITY, "-Infinity"],
    "top_k": [-2, VOCAB + 1, 2**31, 2**63, 2**64, 1.5, "5"],
    "min_p": [-0.1, 1.1, "NaN"],
    "presence_penalty": [-2.1, 2.1, INFINITY],
    "frequency_penalty": [-2.1, 2.1, "-Infinity"],
    "repetition_penalty": [0, -1, INFINITY],
    "seed": [-1, 2**63, 2**64, 1.5, "7"],
    "max_tokens": [0, -1, MAX_SEQ_LEN, 10**6, 2**63, "4"],
    "min_tokens": [-1, 5, 10**6, 2**63],  # 5 > max_tokens (4)
    "stop": [[""], ["x"] * 65, 5, [1], {"a": 1}],
    "stop_token_ids": [[-1], [VOCAB], [10**9], [2**63], ["1"], [1] * 1025, 3],
    "logit_bias": [
        {str(VOCAB): 1},
        {"1": 100.5},
        {"1": -101},
        {"x": 1},
        {"-1": 1},
        {"1": "a"},
        {"1": INFINITY},
        {str(i): 1 for i in range(1025)},
        [1],
    ],
    "ignore_eos": ["yes", 1],
    "skip_special_tokens": [0],
    "stream_options": [{"include_usage": True}],  # without stream
    "logprobs": [-1, 21, 2**63],  # completions: a count
}
CHAT_INVALID: dict[str, list[Any]] = {"top_logprobs": [-1, 21, 100]}
EDGES: dict[str, list[Any]] = {
    "n": [None],  # null means "not given": the default
    "top_k": [VOCAB, -1, 0, 1],
    "temperature": [0, 2],
    "top_p": [1e-9, 1],
    "min_p": [0, 1],
    "presence_penalty": [-2, 2],
    "frequency_penalty": [-2, 2],
    "repetition_penalty": [1e-3, 1e3],
    "seed": [0, 2**63 - 1],
    "max_tokens": [1, 4],
    "min_tokens": [4],
    "stop": [["\n"] * 64],
    "stop_token_ids": [[0, VOCAB - 1]],
    "logit_bias": [{"0": -100, str(VOCAB - 1): 100}],
    "logprobs": [0, 20],
}


def body_text(body: dict[str, Any]) -> bytes:
    """JSON, with ``"Infinity"`` strings written as the bare tokens Python's parser takes."""
    text = json.dumps(body)
    for token in (INFINITY, "-Infinity", "NaN"):
        text = text.replace(f'"{token}"', token)
    return text.encode()


def bad_requests() -> list[tuple[str, str, bytes]]:
    """(endpoint, field, body) for every invalid value of every field."""
    requests = []
    for field, values in INVALID.items():
        for value in values:
            body = {"prompt": "Hello", "max_tokens": 4, field: value}
            requests.append(("completions", field, body_text(body)))
    for field, values in CHAT_INVALID.items():
        for value in values:
            body = {"messages": QUESTION, "max_tokens": 4, "logprobs": True, field: value}
            requests.append(("chat/completions", field, body_text(body)))
    return requests


def edge_requests() -> list[tuple[str, str, bytes]]:
    return [
        ("completions", field, body_text({"prompt": "Hello", "max_tokens": 4, field: value}))
        for field, values in EDGES.items()
        for value in values
    ]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    config = EngineConfig(
        model="smollm2-135m", device="cpu", num_gpu_blocks=256, max_seq_len=MAX_SEQ_LEN,
        max_batch_size=16, max_waiting_requests=64,
    )  # fmt: skip
    with serve_in_thread(build_server(config, port=0, log_level="warning")) as base_url:
        yield base_url


async def stream_tokens(http: httpx.AsyncClient, endpoint: str, body: dict[str, Any]) -> Any:
    """Each choice's streamed token ids."""
    request = {**body, "max_tokens": 12, "stream": True, "return_token_ids": True}
    tokens: dict[int, list[int]] = {}
    async with http.stream("POST", f"/v1/{endpoint}", json=request) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line.removeprefix("data: "))
                assert "error" not in chunk, chunk
                for choice in chunk["choices"]:
                    tokens.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
    return tokens


async def post(http: httpx.AsyncClient, endpoint: str, content: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    return await http.post(f"/v1/{endpoint}", content=content, headers=headers)


def test_bad_sampling_parameters_beside_good_streams_hurt_no_one(url: str) -> None:
    bad, edges = bad_requests(), edge_requests()

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=300) as http:
            alone = [await stream_tokens(http, endpoint, body) for endpoint, body in GOOD]
            streams = asyncio.gather(*(stream_tokens(http, e, b) for e, b in GOOD))
            rounds = 0
            while rounds < 2 or not streams.done():  # the whole list, again and again
                responses = await asyncio.gather(*(post(http, e, c) for e, _, c in bad + edges))
                for (_, field, content), response in zip(bad + edges, responses, strict=True):
                    if (field, content) in {(f, c) for _, f, c in edges}:
                        assert response.status_code == 200, (content, response.text)
                        continue
                    assert response.status_code == 400, (content, response.text)
                    error = response.json()["error"]
                    assert (error["param"] or "").startswith(field), (content, error)
                rounds += 1
            assert await streams == alone
            while True:  # the engine frees finished requests' blocks at its next step
                stats = (await http.get("/v1/cache/stats")).json()
                if stats["used_blocks"] == 0 and stats["active_sequences"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert stats["leaked_blocks"] == 0
            assert (await http.get("/health")).json() == {"status": "ok"}
            assert await stream_tokens(http, *GOOD[0]) == alone[0]  # still serving

    asyncio.run(run())
