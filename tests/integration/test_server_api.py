"""The OpenAI-compatible server against the official ``openai`` client and httpx.

One real uvicorn server on 127.0.0.1 (ephemeral port) serves SmolLM2 on the CPU for the
whole module, configured like the session's offline ``LLM`` it is compared with.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from tests.integration.conftest import metric

import infer
from infer import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
SEEDED = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8)


@pytest.fixture(scope="module")
def offline(smollm2_llm: Any) -> dict[str, Any]:
    """What ``LLM.generate``/``LLM.chat`` answer."""
    return {
        "completions": smollm2_llm.generate(PROMPTS, GREEDY, use_tqdm=False),
        "chat": smollm2_llm.chat(
            QUESTION, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False
        )[0],
        "seeded": smollm2_llm.generate(PROMPTS[2], SEEDED, use_tqdm=False)[0],
    }


def wait_until_idle(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """Cache stats once no sequence runs or waits (aborts land at the next engine step)."""
    deadline = time.monotonic() + timeout
    while True:
        stats: dict[str, Any] = httpx.get(f"{url}/v1/cache/stats").json()
        idle = metric(url, "infer_num_requests_running") == 0
        if idle and metric(url, "infer_num_requests_waiting") == 0 and stats["used_blocks"] == 0:
            return stats
        assert time.monotonic() < deadline, f"still busy: {stats}"
        time.sleep(0.05)


# --- greedy answers equal the offline API's ---------------------------------------------
def test_completions_match_offline(client: openai.OpenAI, offline: dict[str, Any]) -> None:
    expected = offline["completions"]
    response = client.completions.create(
        model="smollm2-135m", prompt=PROMPTS, max_tokens=16, temperature=0
    )
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert [c.text for c in response.choices] == [r.text for r in expected]
    assert [c.finish_reason for c in response.choices] == [
        r.outputs[0].finish_reason for r in expected
    ]
    assert response.usage is not None
    assert response.usage.prompt_tokens == sum(len(r.prompt_token_ids) for r in expected)
    assert response.usage.completion_tokens == sum(len(r.outputs[0].token_ids) for r in expected)
    assert response.usage.total_tokens == response.usage.prompt_tokens + (
        response.usage.completion_tokens
    )

    stream = client.completions.create(
        model="smollm2-135m", prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected[0].text
    assert chunks[-1].choices[0].finish_reason == expected[0].outputs[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_matches_offline(client: openai.OpenAI, offline: dict[str, Any]) -> None:
    expected = offline["chat"]
    assert "Paris" in expected.text
    response = client.chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=24, temperature=0
    )
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    message = response.choices[0].message
    assert message.role == "assistant" and message.content == expected.text
    assert response.choices[0].finish_reason == expected.outputs[0].finish_reason
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert response.usage.completion_tokens == len(expected.outputs[0].token_ids)

    stream = client.chat.completions.create(
        model="smollm2-135m",
        messages=QUESTION,
        max_completion_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    *body, last = chunks
    assert all(c.usage is None for c in body)
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == len(expected.outputs[0].token_ids)
    assert body[-1].choices[0].finish_reason == expected.outputs[0].finish_reason


def test_n_seeded_choices_match_offline(client: openai.OpenAI, offline: dict[str, Any]) -> None:
    """``n`` choices with a ``seed``: the offline API's samples, streamed or not."""
    expected = [c.text for c in offline["seeded"].outputs]
    assert len(set(expected)) > 1  # really sampled
    kwargs: dict[str, Any] = dict(
        model="smollm2-135m", prompt=PROMPTS[2], n=3, temperature=1.0, seed=7, max_tokens=8
    )
    response = client.completions.create(**kwargs)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert [c.text for c in response.choices] == expected
    streamed = ["", "", ""]
    for chunk in client.completions.create(**kwargs, stream=True):
        streamed[chunk.choices[0].index] += chunk.choices[0].text
    assert streamed == expected


def test_stop_strings_and_token_limits(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="smollm2-135m",
        messages=QUESTION,
        temperature=0,
        max_tokens=24,
        stop=[" Paris"],
    )
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].message.content == "The capital of France is"
    limited = client.chat.completions.create(
        model="smollm2-135m",
        messages=QUESTION,
        temperature=0,
        max_completion_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert limited.choices[0].finish_reason == "length"
    assert limited.usage is not None and limited.usage.completion_tokens == 3


def test_completion_logprobs(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model="smollm2-135m", prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=3
    )
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.top_logprobs
    assert logprobs.token_logprobs and logprobs.text_offset is not None
    assert "".join(logprobs.tokens) == choice.text
    assert response.usage is not None and len(logprobs.tokens) == response.usage.completion_tokens
    offset = 0
    for token, logprob, top, start in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, logprobs.text_offset
    ):
        assert start == offset
        offset += len(token)
        assert 3 <= len(top) <= 4 and top[token] == logprob
        assert logprob == pytest.approx(max(top.values()))  # greedy takes the most likely
        assert logprob <= 0.0


def test_chat_logprobs_streamed(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="smollm2-135m",
            messages=QUESTION,
            temperature=0,
            max_tokens=6,  # "The capital of France is Paris", before the end token
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
    )
    entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == 6
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "".join(e.token for e in entries) == text
    for entry in entries:
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token  # greedy: the top alternative
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)


# --- bad input ------------------------------------------------------------------------------
BAD_INPUTS = [
    ("completions", b'{"prompt": "hi", ', 400, "body"),
    ("completions", b"[1, 2]", 400, "body"),
    ("completions", {"max_tokens": 4}, 400, "prompt"),
    ("completions", {"prompt": 42}, 400, "prompt"),
    ("completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("completions", {"prompt": "hi", "max_tokens": "4"}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("completions", {"prompt": "hi", "top_k": -2}, 400, "top_k"),
    ("completions", {"prompt": "hi", "min_p": 2}, 400, "min_p"),
    ("completions", {"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ("completions", {"prompt": "hi", "frequency_penalty": -3}, 400, "frequency_penalty"),
    ("completions", {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("completions", {"prompt": "hi", "seed": -1}, 400, "seed"),
    ("completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "max_tokens": 4096}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("completions", {"prompt": "hi", "echo": True, "stream": True}, 400, "echo"),
    ("completions", {"prompt": "hi", "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    ("completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("completions", {"prompt": ""}, 400, "prompt"),
    ("completions", {"prompt": []}, 400, "prompt"),
    ("completions", {"prompt": [[1, 2], []]}, 400, "prompt"),
    ("completions", {"prompt": [10**9]}, 400, "prompt"),
    ("completions", {"prompt": "word " * 2100}, 400, "prompt"),
    ("completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "messages.0.role"),
    ("chat/completions", {"messages": [{"role": "user", "content": 7}]}, 400,
     "messages.0.content"),
    ("chat/completions", {"messages": QUESTION, "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {"messages": QUESTION, "max_completion_tokens": -5}, 400,
     "max_completion_tokens"),
    ("chat/completions", {"messages": [{"role": "user", "content": "word " * 2100}]}, 400,
     "messages"),
    ("chat/completions", {"messages": QUESTION, "model": "nope"}, 404, "model"),
    # Values that pass the types but not the model, or that no client should send.
    ("completions", {"prompt": "hi", "max_tokens": 4, "min_tokens": 1,
                     "stop_token_ids": [1000000000]}, 400, "stop_token_ids"),
    ("completions", {"prompt": "hi", "stop_token_ids": [49152]}, 400, "stop_token_ids"),
    ("completions", {"prompt": "hi", "top_k": 9223372036854775808}, 400, "top_k"),
    ("completions", {"prompt": "hi", "top_k": 49153}, 400, "top_k"),
    ("completions", {"prompt": "hi", "temperature": 1e9}, 400, "temperature"),
    ("completions", b'{"prompt": "hi", "temperature": Infinity}', 400, "temperature"),
    ("completions", b'{"prompt": "hi", "top_p": NaN}', 400, "top_p"),
    ("completions", {"prompt": "hi", "seed": 2**64}, 400, "seed"),
    ("completions", {"prompt": "hi", "min_tokens": 5000, "max_tokens": None}, 400, "min_tokens"),
    ("completions", {"prompt": "hi", "logit_bias": {"49152": 1}}, 400, "logit_bias"),
    ("completions", {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias.5"),
    ("completions", {"prompt": "hi", "logit_bias": {"five": 1}}, 400, "logit_bias.five"),
    ("completions", {"prompt": "hi", "stop": ["x"] * 65}, 400, "stop"),
    ("completions", {"prompt": [-1]}, 400, "prompt"),
    ("chat/completions", {"messages": QUESTION, "logprobs": True, "top_logprobs": 100}, 400,
     "top_logprobs"),
    ("chat/completions", {"messages": QUESTION, "max_tokens": None, "min_tokens": 4096}, 400,
     "min_tokens"),
]  # fmt: skip

# Every field the server does not honour is refused by name (never a silent 200).
UNSUPPORTED = [
    ("chat/completions", "functions", [{"name": "f"}]),
    ("chat/completions", "function_call", "auto"),
    ("chat/completions", "modalities", ["text", "audio"]),
    ("chat/completions", "verbosity", "low"),
    ("chat/completions", "moderation", {"model": "omni-moderation-latest"}),
    ("completions", "service_tier", "flex"),
    ("chat/completions", "store", True),
    ("chat/completions", "surprise", 1),
    ("completions", "best_of", 2),
    ("chat/completions", "echo", True),
    ("chat/completions", "prompt_logprobs", 1),
    ("completions", "suffix", "!"),
]  # fmt: skip


def _post(url: str, endpoint: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(
            f"{url}/v1/{endpoint}", content=body, headers={"Content-Type": "application/json"}
        )
    return httpx.post(f"{url}/v1/{endpoint}", json=body)


def test_bad_inputs_get_openai_errors_and_never_reach_the_engine(url: str) -> None:
    before = httpx.get(f"{url}/v1/cache/stats").json()
    tokens_before = metric(url, "infer_prompt_tokens_total")
    for endpoint, body, status, param in BAD_INPUTS:
        response = _post(url, endpoint, body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["param"] == param, (body, error)
        assert error["message"] and error["type"]
        if param is not None:
            assert param.split(".")[0] in error["message"]
    assert metric(url, "infer_prompt_tokens_total") == tokens_before
    after = httpx.get(f"{url}/v1/cache/stats").json()
    assert after["total_allocations"] == before["total_allocations"]
    assert httpx.get(f"{url}/health").status_code == 200


def test_bad_inputs_do_not_disturb_a_running_stream(
    url: str, client: openai.OpenAI, offline: dict[str, Any]
) -> None:
    texts: list[str] = []

    def stream() -> None:
        chunks = client.completions.create(
            model="smollm2-135m", prompt=PROMPTS[1], max_tokens=16, temperature=0, stream=True
        )
        texts.append("".join(c.choices[0].text for c in chunks))

    thread = threading.Thread(target=stream)
    thread.start()
    while thread.is_alive():
        for endpoint, body, status, _ in BAD_INPUTS[::4]:
            assert _post(url, endpoint, body).status_code == status
    thread.join()
    assert texts == [offline["completions"][1].text]


@pytest.mark.parametrize(("endpoint", "field", "value"), UNSUPPORTED)
def test_fields_the_server_does_not_honour_are_refused_by_name(
    url: str, endpoint: str, field: str, value: Any
) -> None:
    body = {"prompt": "hi"} if endpoint == "completions" else {"messages": QUESTION}
    response = _post(url, endpoint, {**body, "max_tokens": 2, field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}: ")


def test_unsupported_fields_asking_for_the_default_pass(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=2, store=False, tools=[],
        response_format={"type": "text"}, service_tier="auto", modalities=["text"],
    )  # fmt: skip
    assert response.choices[0].message.content
    completion = client.completions.create(
        model="smollm2-135m", prompt="hi", max_tokens=2, echo=False, best_of=1
    )
    assert completion.choices[0].text is not None
    tool_reply = {"role": "assistant", "content": "Paris", "tool_calls": [{"id": "1"}]}
    refused = _post(url_of(client), "chat/completions", {"messages": [*QUESTION, tool_reply]})
    assert refused.status_code == 400  # a tool call without its function
    assert refused.json()["error"]["param"].startswith("messages.1.tool_calls.0.")


def url_of(client: openai.OpenAI) -> str:
    return str(client.base_url).removesuffix("/").removesuffix("/v1")


def test_logit_bias_bans_and_forces_tokens(url: str) -> None:
    def token_ids(**fields: Any) -> list[int]:
        body = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0,
                "return_token_ids": True, **fields}  # fmt: skip
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        ids: list[int] = response.json()["choices"][0]["token_ids"]
        return ids

    greedy = token_ids()
    banned = token_ids(logit_bias={str(greedy[0]): -100})
    assert greedy[0] not in banned
    assert token_ids(logit_bias={"42": 100}) == [42] * 4


def test_openapi_document_says_what_the_server_does(url: str) -> None:
    document = httpx.get(f"{url}/openapi.json").json()
    assert '"422"' not in httpx.get(f"{url}/openapi.json").text
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = document["paths"][path]["post"]["responses"]
        for status in ("400", "401", "404", "500", "503"):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, status)
        assert "Retry-After" in responses["503"]["headers"]
        assert "text/event-stream" in responses["200"]["content"]
    assert "503" in document["paths"]["/health"]["get"]["responses"]
    request = document["components"]["schemas"]["ChatCompletionRequest"]
    assert request["additionalProperties"] is False
    temperature = request["properties"]["temperature"]["anyOf"][0]
    assert (temperature["minimum"], temperature["maximum"]) == (0, 2)
    assert request["properties"]["top_logprobs"]["anyOf"][0]["maximum"] == 20


def test_method_not_allowed_names_the_allowed_methods(url: str) -> None:
    response = httpx.get(f"{url}/v1/completions")
    assert response.status_code == 405 and response.headers["Allow"] == "POST"
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_connection_idle_for_6_seconds_is_reused(url: str) -> None:
    """Clients drop idle connections after 5 s (httpx); the server keeps them longer, so a
    client never reuses one that the server is closing at that moment."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        for attempt in range(2):
            if attempt:
                time.sleep(6.0)  # idle between the two requests (not after the last)
            conn.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert _read_response(conn).startswith(b"HTTP/1.1 200")


def _read_response(conn: socket.socket) -> bytes:
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))  # fmt: skip
    while len(body) < length:
        body += conn.recv(4096)
    return data


def test_unknown_routes_and_methods(url: str) -> None:
    missing = httpx.get(f"{url}/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{url}/v1/completions").status_code == 405


# --- the other endpoints --------------------------------------------------------------------
def test_models_health_and_cache_stats(url: str, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m"]
    assert models.data[0].object == "model"
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    stats = wait_until_idle(url)
    for key in ("num_blocks", "utilization", "internal_fragmentation", "allocs_per_s",
                "prefix_hit_rate", "evictions", "preemptions"):  # fmt: skip
        assert key in stats
    assert stats["num_blocks"] == 512 and stats["leaked_blocks"] == 0


def test_probes_answer_head_and_vllm_paths(url: str) -> None:
    for method, path in [("HEAD", "/health"), ("HEAD", "/ping"), ("GET", "/ping"),
                         ("POST", "/ping")]:  # fmt: skip
        response = httpx.request(method, f"{url}{path}")
        assert response.status_code == 200, (method, path)
        assert (response.content == b"") == (method == "HEAD")
    assert httpx.get(f"{url}/version").json() == {"version": infer.__version__}


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("completions", {"prompt": "word " * 2100}),
        ("completions", {"prompt": "hi", "max_tokens": 4096}),
        ("chat/completions", {"messages": [{"role": "user", "content": "word " * 2100}]}),
    ],
    ids=["prompt", "prompt_and_max_tokens", "conversation"],
)
def test_a_context_overflow_has_openais_code(url: str, endpoint: str, body: Any) -> None:
    error = _post(url, endpoint, body).json()["error"]
    assert error["code"] == "context_length_exceeded"
    other = _post(url, endpoint, {**body, "temperature": -1}).json()["error"]
    assert other["param"] == "temperature" and other["code"] is None


def test_metrics_count_requests_and_tokens(url: str, client: openai.OpenAI) -> None:
    finished = metric(url, "infer_request_finished_total", default=0.0)
    generated = metric(url, "infer_generation_tokens_total")
    ttft = metric(url, "infer_time_to_first_token_seconds_count")
    client.completions.create(
        model="smollm2-135m", prompt=PROMPTS, max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert metric(url, "infer_request_finished_total") == finished + 3
    assert metric(url, "infer_generation_tokens_total") == generated + 15
    assert metric(url, "infer_time_to_first_token_seconds_count") == ttft + 3
    assert metric(url, "infer_inter_token_latency_seconds_count") >= 12
    assert metric(url, "infer_e2e_request_latency_seconds_count") >= 3
    for name in ("infer_num_requests_running", "infer_num_requests_waiting",
                 "infer_kv_cache_usage_ratio", "infer_num_preemptions_total"):  # fmt: skip
        assert metric(url, name) >= 0


# --- cancellation ---------------------------------------------------------------------------
LONG = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True}


def test_disconnected_stream_is_aborted_and_its_blocks_freed(url: str) -> None:
    generated = metric(url, "infer_generation_tokens_total")
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}) as response,
    ):
        lines = response.iter_lines()
        for _ in range(3):
            assert next(line for line in lines if line.startswith("data: "))
    stats = wait_until_idle(url)
    assert stats["leaked_blocks"] == 0
    assert metric(url, "infer_generation_tokens_total") - generated < 1000  # aborted early


def test_disconnected_non_streaming_request_is_aborted(url: str) -> None:
    generated = metric(url, "infer_generation_tokens_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=LONG, timeout=1.5)
    stats = wait_until_idle(url)
    assert stats["leaked_blocks"] == 0
    assert metric(url, "infer_generation_tokens_total") - generated < 1000
    assert httpx.get(f"{url}/health").status_code == 200
