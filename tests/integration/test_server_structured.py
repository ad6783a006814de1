"""``response_format``, ``structured_outputs`` and tools through the server, with the
official ``openai`` client and SmolLM2 on the CPU."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from tests.integration.conftest import metric

MODEL = "smollm2-135m"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
ASK_WEATHER: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
# Seeds whose noise for the first output token peaks (a uniform draw of 1.0: Gumbel noise of
# +inf) at a token every grammar here forbids first: at b806c91 the sampler drew that token
# through the mask (-inf + inf is NaN, and argmax takes a NaN).
PEAKING_SEEDS = (130, 538, 652, 2437)


def test_response_format_json_schema_chat_and_completions(client: openai.OpenAI) -> None:
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": WEATHER, "strict": True},
    }
    chat = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, max_tokens=40, temperature=0, response_format=fmt
    )
    assert chat.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(chat.choices[0].message.content or ""), WEATHER)
    completion = client.completions.create(
        model=MODEL,
        prompt="Weather report as JSON:",
        max_tokens=40,
        n=2,
        temperature=1.0,
        seed=5,
        extra_body={"response_format": fmt},
    )
    for choice in completion.choices:
        jsonschema.validate(json.loads(choice.text), WEATHER)


def test_json_object_and_vllm_structured_outputs(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me a JSON object with a name."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_object"},
    )
    text = chat.choices[0].message.content or ""
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")
    chosen = client.completions.create(
        model=MODEL,
        prompt="Is the sky blue? Answer:",
        max_tokens=5,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert chosen.choices[0].text in ("yes", "no")


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_gives_valid_tool_calls(client: openai.OpenAI, stream: bool) -> None:
    calls, finish = _tool_calls(client, stream, tool_choice="required")
    assert finish == "tool_calls"
    assert calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), schemas[name])


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_gives_its_function(client: openai.OpenAI, stream: bool) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    calls, finish = _tool_calls(client, stream, tool_choice=choice, parallel_tool_calls=False)
    assert finish == "tool_calls"
    assert [name for name, _ in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0][1]), WEATHER)


def _tool_calls(
    client: openai.OpenAI, stream: bool, **fields: Any
) -> tuple[list[tuple[str, str]], str | None]:
    """(name, arguments) of each tool call, and the finish reason, streamed or not."""
    common: Any = {"model": MODEL, "messages": ASK_WEATHER, "max_tokens": 80, "temperature": 0}
    if not stream:
        response = client.chat.completions.create(**common, tools=TOOLS, **fields)
        message = response.choices[0].message
        assert message.content is None
        assert message.tool_calls
        assert all(call.id.startswith("call_") for call in message.tool_calls)
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls]  # type: ignore[union-attr]
        return calls, response.choices[0].finish_reason
    merged: dict[int, list[str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**common, tools=TOOLS, stream=True, **fields):
        choice = chunk.choices[0]
        assert not choice.delta.content
        for delta in choice.delta.tool_calls or []:
            assert delta.function is not None
            if delta.id is not None:
                merged[delta.index] = [delta.function.name or "", ""]
            merged[delta.index][1] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return [(name, args) for name, args in merged.values()], finish


def test_tool_results_go_back_into_the_conversation(client: openai.OpenAI) -> None:
    conversation: Any = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    response = client.chat.completions.create(
        model=MODEL, messages=conversation, tools=TOOLS, max_tokens=16, temperature=0
    )
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    ("endpoint", "fields", "param"),
    [
        (
            "chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            "completions",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ("completions", {"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex"),
        (
            "chat/completions",
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": 1}}}
                ],
                "tool_choice": "required",
            },
            "tools.0.function.parameters",
        ),
        (
            "chat/completions",
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ("chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_constraints_get_a_400_naming_the_field(
    url: str, endpoint: str, fields: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = (
        {"prompt": "hi"} if endpoint == "completions" else {"messages": ASK_WEATHER}
    )
    response = httpx.post(f"{url}/v1/{endpoint}", json={**body, "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}: ")


@pytest.mark.stress  # 32 requests of 80 tokens, 8 at a time: minutes of CPU
def test_fresh_grammars_and_forced_tool_calls_always_validate(
    url: str, client: openai.OpenAI
) -> None:
    """Every request brings a grammar the server has not seen (compiled on first use), one
    after another and many at once; sampled at temperature 1, every output validates and no
    sampled token ever broke its grammar."""
    one_by_one = [*PEAKING_SEEDS[:2], 1, 2, 3, 4]
    for index, seed in enumerate(one_by_one):
        _validate_fresh(client, index, seed)
    at_once = [*PEAKING_SEEDS[2:], *range(10, 32)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(_validate_fresh, [client] * len(at_once), range(100, 200), at_once))
    assert metric(url, "infer_structured_output_errors_total") == 0


def _validate_fresh(client: openai.OpenAI, index: int, seed: int) -> None:
    """A request under a new grammar (its names carry ``index``): a JSON schema, a required
    tool call or a named one in turn; its output must validate."""
    key, tool = f"city_{index}", f"get_weather_{index}"
    schema = {
        "type": "object",
        "properties": {
            key: {"type": "string", "maxLength": 12},
            "population": {"type": "integer", "minimum": 0, "maximum": 9999},
        },
        "required": [key, "population"],
        "additionalProperties": False,
    }
    common: Any = {"model": MODEL, "max_tokens": 80, "temperature": 1.0, "seed": seed}
    if index % 3 == 0:
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
        response = client.chat.completions.create(
            messages=[{"role": "user", "content": "Describe a city as JSON."}],
            response_format=fmt,
            **common,
        )
        choice = response.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content or ""), schema)
        return
    tools: Any = [{"type": "function", "function": {"name": tool, "parameters": WEATHER}}]
    forced: Any = "required" if index % 3 == 1 else {"type": "function", "function": {"name": tool}}
    response = client.chat.completions.create(
        messages=ASK_WEATHER, tools=tools, tool_choice=forced, parallel_tool_calls=False, **common
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert [call.function.name for call in calls] == [tool], choice  # type: ignore[union-attr]
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)  # type: ignore[union-attr]
