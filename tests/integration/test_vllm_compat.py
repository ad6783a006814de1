"""Requests written for vLLM, and by clients that send every field (unset ones as null),
against a real server on the embedded model: vLLM's extra parameters are honoured or
refused with why, explicit nulls mean "not given", and ``/tokenize`` and ``/detokenize``
answer in vLLM's shapes."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
GREEDY = {"temperature": 0, "max_tokens": 8}


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=300)


def ok(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = post(url, path, body)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def chat(url: str, **fields: Any) -> dict[str, Any]:
    return ok(url, "/v1/chat/completions", {"messages": QUESTION, **GREEDY, **fields})


def complete(url: str, **fields: Any) -> dict[str, Any]:
    return ok(url, "/v1/completions", {"prompt": PROMPT, **GREEDY, **fields})


# Every optional field a client may send as null, per endpoint.
NULLS = {
    "n": None, "stream": None, "stream_options": None, "logprobs": None, "ignore_eos": None,
    "min_tokens": None, "skip_special_tokens": None, "top_p": None, "top_k": None,
    "min_p": None, "seed": None, "stop": None, "stop_token_ids": None, "logit_bias": None,
    "presence_penalty": None, "frequency_penalty": None, "repetition_penalty": None,
    "user": None, "response_format": None, "structured_outputs": None, "return_token_ids": None,
    "include_stop_str_in_output": None, "add_special_tokens": None, "request_id": None,
    "truncate_prompt_tokens": None, "allowed_token_ids": None, "guided_json": None,
    "guided_regex": None, "guided_choice": None, "guided_grammar": None, "echo": None,
    "prompt_logprobs": None, "priority": None, "bad_words": None, "length_penalty": None,
    "spaces_between_special_tokens": None, "best_of": None, "suffix": None, "model": None,
}  # fmt: skip
CHAT_NULLS = {
    "max_completion_tokens": None, "top_logprobs": None, "tools": None, "tool_choice": None,
    "parallel_tool_calls": None, "chat_template_kwargs": None, "add_generation_prompt": None,
    "continue_final_message": None, "chat_template": None, "documents": None,
    "service_tier": None, "store": None, "metadata": None, "modalities": None,
}  # fmt: skip


def test_explicit_nulls_mean_not_given_on_both_endpoints(url: str) -> None:
    assert complete(url, **NULLS)["choices"][0]["text"] == complete(url)["choices"][0]["text"]
    nulls = chat(url, **NULLS, **CHAT_NULLS)["choices"][0]["message"]
    assert nulls == chat(url)["choices"][0]["message"]


def test_the_stop_string_stays_with_include_stop_str_in_output(url: str) -> None:
    cut = chat(url, stop=[" Paris"])["choices"][0]["message"]["content"]
    kept = chat(url, stop=[" Paris"], include_stop_str_in_output=True)
    assert kept["choices"][0]["message"]["content"] == cut + " Paris"
    assert kept["choices"][0]["finish_reason"] == "stop"


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(url: str) -> None:
    full = ok(url, "/tokenize", {"prompt": PROMPT})["tokens"]
    cut = complete(url, truncate_prompt_tokens=3, return_token_ids=True)
    assert cut["usage"]["prompt_tokens"] == 3
    same = ok(url, "/v1/completions", {"prompt": full[-3:], **GREEDY})
    assert cut["choices"][0]["text"] == same["choices"][0]["text"]
    long = complete(url, prompt="word " * 2100, truncate_prompt_tokens=-1, max_tokens=2)
    assert long["usage"]["prompt_tokens"] == 2048 - 2  # what fits beside max_tokens


def test_allowed_token_ids_are_the_only_tokens_sampled(url: str) -> None:
    allowed = [42, 43, 44]
    reply = complete(url, allowed_token_ids=allowed, return_token_ids=True, temperature=1.0)
    ids = reply["choices"][0]["token_ids"]
    assert len(ids) == GREEDY["max_tokens"] and set(ids) <= set(allowed)  # no end token
    refused = post(url, "/v1/completions", {"prompt": PROMPT, "allowed_token_ids": [10**6]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "allowed_token_ids"


def test_request_id_names_the_response(url: str) -> None:
    assert chat(url, request_id="my-id-1")["id"] == "chatcmpl-my-id-1"
    assert complete(url, request_id="my-id-1")["id"] == "cmpl-my-id-1"


def test_continuous_usage_stats_count_in_every_chunk(url: str) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"prompt": PROMPT, **GREEDY, "stream": True, "stream_options": options,
            "ignore_eos": True, "logprobs": 1}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {")]  # fmt: skip
    # A slow reader may get several tokens in one chunk; each chunk's logprobs say how many.
    token_chunks = [c for c in chunks if c["choices"]]
    sent = [len(c["choices"][0]["logprobs"]["tokens"]) for c in token_chunks]
    counts = [c["usage"]["completion_tokens"] for c in token_chunks]
    assert counts == [sum(sent[: i + 1]) for i in range(len(sent))]
    assert chunks[-1]["usage"]["completion_tokens"] == GREEDY["max_tokens"]


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("guided_choice", ["Paris", "Lyon"], lambda text: text in ("Paris", "Lyon")),
        ("guided_regex", "[A-Z][a-z]+", lambda text: re.fullmatch("[A-Z][a-z]+", text)),
        ("guided_json", {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"], "additionalProperties": False},
         lambda text: set(json.loads(text)) == {"city"}),
    ],
)  # fmt: skip
def test_legacy_guided_fields_constrain_the_answer(
    url: str, field: str, value: Any, valid: Any
) -> None:
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 24, field: value}
    for _ in range(2):  # a grammar's first use can still break it (issue 40): checked second
        reply = ok(url, "/v1/chat/completions", body)
    assert valid(reply["choices"][0]["message"]["content"])


def test_chat_template_parameters_shape_the_prompt(url: str) -> None:
    def tokens(**fields: Any) -> list[int]:
        ids: list[int] = ok(url, "/tokenize", {"messages": QUESTION, **fields})["tokens"]
        return ids

    opened = tokens()
    closed = tokens(add_generation_prompt=False)
    assert opened[: len(closed)] == closed and len(opened) > len(closed)  # + assistant opener
    partial = [*QUESTION, {"role": "assistant", "content": "The capital is"}]
    continued = ok(url, "/tokenize", {"messages": partial, "add_generation_prompt": False,
                                      "continue_final_message": True})  # fmt: skip
    text = ok(url, "/detokenize", {"tokens": continued["tokens"]})["prompt"]
    assert text.endswith("The capital is")  # left open for the model to go on
    assert chat(url, chat_template_kwargs={"enable_thinking": False})["choices"]
    with_documents = tokens(documents=[{"title": "Note", "text": "Paris"}])
    assert with_documents == opened  # SmolLM2's template has no documents: same prompt


@pytest.mark.parametrize(
    ("field", "value"),
    [("echo", True), ("prompt_logprobs", 1), ("bad_words", ["Paris"]), ("priority", 1),
     ("length_penalty", 2.0), ("use_beam_search", True), ("suffix", "!"),
     ("chat_template", "{{ messages }}")],
)  # fmt: skip
def test_vllm_parameters_that_cannot_be_honoured_are_refused_with_why(
    url: str, field: str, value: Any
) -> None:
    response = post(url, "/v1/chat/completions", {"messages": QUESTION, field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}: ")
    assert "unknown field" not in error["message"] and "(" in error["message"]


def test_unknown_fields_stay_refused(url: str) -> None:
    response = post(url, "/v1/completions", {"prompt": PROMPT, "surprise": None})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "surprise: unknown field"


def test_tokenize_and_detokenize_in_vllms_shapes(url: str) -> None:
    plain = ok(url, "/tokenize", {"prompt": PROMPT, "return_token_strs": True})
    assert set(plain) == {"count", "max_model_len", "tokens", "token_strs"}
    assert plain["count"] == len(plain["tokens"]) == len(plain["token_strs"])
    assert plain["max_model_len"] == 2048
    assert ok(url, "/detokenize", {"tokens": plain["tokens"]}) == {"prompt": PROMPT}
    conversation = ok(url, "/tokenize", {"model": "smollm2-135m", "messages": QUESTION})
    assert conversation["token_strs"] is None
    assert conversation["count"] == chat(url)["usage"]["prompt_tokens"]
    for path, body, status, param in [
        ("/tokenize", {"prompt": PROMPT, "model": "gpt-4"}, 404, "model"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/detokenize", {"tokens": [49152]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens.0"),
    ]:
        response = post(url, path, body)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["param"] == param, body
