"""What a request passes before it costs anything, through the server: the limits on its
inputs, its constraint checked in a worker process (grammars whose language is empty, ones
that crash or stall the compiler), and the body read within bounds. Each is an OpenAI-style
error naming the field, and the server goes on serving."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from infer.server import build_server, serve_in_thread
from infer.server.guards.request_limits import RequestLimits

PROMPT = "The capital of France is"
CHAIN = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(6000)) + 'r6000: "b"\n'


@pytest.fixture(scope="module")
def url(smollm2_config: Any) -> Any:
    # Room for 100,000 choices (~2.4 MB), so that it is the compile's deadline they meet.
    limits = RequestLimits(
        max_body_bytes=4_000_000, max_grammar_bytes=4_000_000, max_choices=200_000,
        max_messages=8,
    )  # fmt: skip
    server = build_server(
        smollm2_config, port=0, log_level="warning", limits=limits, grammar_timeout=3.0
    )
    with serve_in_thread(server) as base_url:
        yield base_url


def _complete(url: str, **fields: Any) -> httpx.Response:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def _refused(response: httpx.Response, param: str, status: int = 400) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert f"{param}: " in error["message"], error
    return str(error["message"])


EMPTY_LANGUAGES = [
    ("json", {"$ref": "#"}),
    (
        "json",
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    ),
    ("grammar", "start: a b\na: b\nb: a\n"),
    ("grammar", 'start: "a" x\nx: "b" x\n'),  # forced and endless: "abbb..."
    ("grammar", 'start: a | b\na: "x" a\nb: "y" b\n'),  # a choice, then endless either way
    ("grammar", 'start: "a" x\nx: y\ny: x\n'),  # "a", then a rule no text ends
    ("regex", "[a&&b]"),
]


@pytest.mark.parametrize(("kind", "value"), EMPTY_LANGUAGES)
def test_a_constraint_no_output_can_satisfy_is_a_400_before_generation(
    url: str, kind: str, value: Any
) -> None:
    for stream in (False, True):
        response = _complete(url, structured_outputs={kind: value}, stream=stream)
        assert "no output can satisfy it" in _refused(response, f"structured_outputs.{kind}")


def test_a_grammar_that_dead_ends_mid_generation_ends_with_an_error(url: str) -> None:
    """A letter then a rule no text ends, or an unlikely "QQQQ": the language is not empty,
    so the request is admitted; the model's letter leaves the next mask with nothing (the
    engine's failed matcher, ``StructuredOutputs.take_failed``), never an empty success."""
    dead_end = 'start: /[a-z ]/ x | "QQQQ"\nx: y\ny: x\n'
    response = _complete(url, structured_outputs={"grammar": dead_end})
    assert "structured_outputs" in _refused(response, "structured_outputs")
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 4, "stream": True,
        "structured_outputs": {"grammar": dead_end},
    }) as stream:  # fmt: skip
        body = stream.read().decode()
    assert stream.status_code == 400 or '"error"' in body, body


def test_limits_name_the_field_and_the_flag(url: str) -> None:
    message = _refused(_complete(url, n=129), "n")
    assert "limit of 128 (--max-n)" in message
    _refused(_complete(url, stop=["x"] * 65), "stop")
    assert "(--max-stop-string-bytes)" in _refused(_complete(url, stop=["x" * 1025]), "stop.0")
    bias = {str(i): 1.0 for i in range(1025)}
    assert "(--max-logit-bias)" in _refused(_complete(url, logit_bias=bias), "logit_bias")
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        nested = {"type": "object", "properties": {"a": nested}}
    message = _refused(
        _complete(url, structured_outputs={"json": nested}), "structured_outputs.json"
    )
    assert "(--max-grammar-depth)" in message
    tools = [{"type": "function", "function": {"name": "f", "parameters": nested}}]
    chat = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 2}
    response = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
    assert "(--max-grammar-depth)" in _refused(response, "tools.0")
    chat = {"messages": [{"role": "user", "content": "hi"}] * 9, "max_tokens": 2}
    response = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
    assert "limit of 8 (--max-messages)" in _refused(response, "messages")
    response = httpx.post(f"{url}/tokenize", json={"messages": chat["messages"]}, timeout=60)
    assert "(--max-messages)" in _refused(response, "messages")


def test_an_oversized_body_is_a_413_before_it_is_read(url: str) -> None:
    response = _complete(url, prompt="x" * 4_100_000)
    assert "(--max-body-bytes)" in _refused(response, "body", status=413)


@pytest.mark.serial
def test_grammar_bombs_are_400s_and_health_keeps_answering(url: str) -> None:
    """A grammar that crashes the compiler and 100,000 choices that overrun its deadline,
    beside /health probes and an innocent completion."""
    latencies: list[float] = []
    stop = time.monotonic() + 1e9

    def probe() -> None:
        with httpx.Client(timeout=10) as client:
            while time.monotonic() < stop:
                start = time.perf_counter()
                assert client.get(f"{url}/health").status_code == 200
                latencies.append(time.perf_counter() - start)
                time.sleep(0.02)

    with ThreadPoolExecutor(2) as pool:
        probing = pool.submit(probe)
        try:  # the probes stop however the requests end
            crash = _complete(url, structured_outputs={"grammar": CHAIN})
            choices = [f"option number {i}" for i in range(100_000)]
            slow = _complete(url, structured_outputs={"choice": choices})
            innocent = _complete(url)
        finally:
            stop = time.monotonic()
        probing.result()
    assert "crashed" in _refused(crash, "structured_outputs.grammar")
    assert "--grammar-timeout" in _refused(slow, "structured_outputs.choice")
    assert innocent.status_code == 200 and innocent.json()["choices"][0]["text"]
    latencies.sort()
    assert latencies[int(len(latencies) * 0.99)] < 0.1, latencies[-5:]
    # the crashed worker was started again: constraints are still checked
    response = _complete(url, structured_outputs={"choice": ["yes", "no"]})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] in ("yes", "no")
