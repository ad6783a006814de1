"""Request bodies: a large one is parsed off the event loop, to ``json.loads``'s result and
errors; either way the server's answers are the same."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from infer.config import EngineConfig
from infer.server.guards.json_body import INLINE_BYTES, JSONBodyRoute, loads_yielding, parse_json
from infer.server.http.api import create_app

LARGE_BIAS = {"prompt": "Hi", "logit_bias": {str(i): 1 for i in range(100_000)}}
ODD = (
    '{"nan": NaN, "inf": -Infinity, "big": 18446744073709551616, "f": 1e400, "dup": 1, '
    '"dup": 2, "s": "caf\\u00e9 \\ud800 \\n\\"", "nested": [[{"a": [true, false, null]}]], '
    '"pad": "' + "x" * INLINE_BYTES + '"}'
)


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, allow_nan=True) == json.dumps(b, allow_nan=True)


def test_a_large_body_parses_to_what_json_loads_gives() -> None:
    for text in (ODD, json.dumps(LARGE_BIAS), "\ufeff" + ODD):
        body = text.encode()
        assert len(body) > INLINE_BYTES
        assert _same(asyncio.run(parse_json(body)), json.loads(body))
    assert asyncio.run(parse_json(b'{"prompt": "hi"}')) == {"prompt": "hi"}


@pytest.mark.parametrize(
    "body",
    [
        ODD[:-1].encode(),  # cut short
        (ODD + " x").encode(),  # extra data
        ODD.replace('"dup": 2', '"dup" 2').encode(),  # a missing colon
        b"[" * 100_000 + b"]" * 100_000,  # nested beyond the recursion limit
        b'{"s": "' + b"\xff" * INLINE_BYTES + b'"}',  # not UTF-8
    ],
)
def test_a_large_body_fails_as_json_loads_fails(body: bytes) -> None:
    with pytest.raises(Exception) as expected:
        json.loads(body)
    with pytest.raises(type(expected.value)) as got:
        asyncio.run(parse_json(body))
    if isinstance(expected.value, json.JSONDecodeError):
        assert isinstance(got.value, json.JSONDecodeError)
        assert (got.value.msg, got.value.pos) == (expected.value.msg, expected.value.pos)


def test_the_event_loop_runs_while_a_large_body_parses() -> None:
    """``json.loads`` holds the loop (and the GIL) for the whole parse: nothing else runs.
    Off the loop, other tasks keep running meanwhile."""
    body = json.dumps(LARGE_BIAS).encode()

    async def ticks_during_parse() -> int:
        ticks = 0
        parsing = asyncio.ensure_future(parse_json(body))
        while not parsing.done():
            await asyncio.sleep(0)
            ticks += 1
        assert (await parsing)["logit_bias"]["99999"] == 1
        return ticks

    assert asyncio.run(ticks_during_parse()) > 10


def test_the_yielding_parser_is_json_loads() -> None:
    assert _same(loads_yielding(ODD.encode()), json.loads(ODD))


def test_the_server_answers_large_and_small_bodies_alike() -> None:
    """Through the app (validation refuses before any handler runs): the same 400s."""
    client = TestClient(create_app(EngineConfig(model="smollm2-135m", device="cpu")))
    cases: list[tuple[bytes, str]] = [
        (json.dumps(LARGE_BIAS).encode(), "logit_bias"),
        (json.dumps({"prompt": "Hi", "logit_bias": {"1": "x"}}).encode(), "logit_bias.1"),
        (b'{"prompt": "hi", "temperature": NaN, "pad": "' + b"x" * INLINE_BYTES + b'"}',
         "temperature"),
        (b'{"prompt": "hi", "temperature": NaN}', "temperature"),
        (b'{"prompt": "hi", "pad": "' + b"x" * INLINE_BYTES, "body"),
        (b'{"prompt": "hi", ', "body"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "body"),
    ]  # fmt: skip
    for body, param in cases:
        response = client.post("/v1/completions", content=body,
                               headers={"content-type": "application/json"})  # fmt: skip
        assert response.status_code == 400, (param, response.text)
        assert response.json()["error"]["param"] == param


def test_every_route_of_the_app_reads_its_body_off_the_loop() -> None:
    app = create_app(EngineConfig(model="smollm2-135m", device="cpu"))
    posts = [r for r in app.routes if "POST" in getattr(r, "methods", ())]
    assert posts and all(isinstance(r, JSONBodyRoute) for r in posts)
