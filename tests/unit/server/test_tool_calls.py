"""Tool-call formats: parsing whole outputs and streams, and rendering conversations."""

from __future__ import annotations

import json
from typing import Any

from infer.server.protocol import ChatCompletionRequest
from infer.server.tool_calls import HERMES, LLAMA3_JSON, ToolCalls, render, tool_call_format

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "add"}},
]
HERMES_OUTPUT = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)


def _calls(tool_choice: Any = "auto", **fields: Any) -> ToolCalls:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
         "tool_choice": tool_choice, **fields}
    )  # fmt: skip
    calls = ToolCalls.of(request, "{{ '<tool_call>' }}")
    assert calls is not None
    return calls


def test_formats_are_read_from_the_chat_template() -> None:
    assert tool_call_format("... <tool_call> ...") is HERMES
    assert tool_call_format("{{ '<|python_tag|>' }} ipython") is LLAMA3_JSON
    assert tool_call_format(None) is HERMES


def test_hermes_calls_are_parsed_with_the_text_before_them() -> None:
    message = _calls().message(HERMES_OUTPUT, "stop")
    assert message.content == "Let me check."
    assert message.finish_reason == "tool_calls"
    assert message.tool_calls is not None
    parsed = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
    assert parsed == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    single = _calls(parallel_tool_calls=False).message(HERMES_OUTPUT, "stop")
    assert single.tool_calls is not None and len(single.tool_calls) == 1


def test_text_without_calls_unknown_functions_and_tool_choice_none_stay_content() -> None:
    assert _calls().message("Just text.", "stop").tool_calls is None
    unknown = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    assert _calls().message(unknown, "stop").content == unknown
    assert _calls("none").message(HERMES_OUTPUT, "stop").tool_calls is None


def test_llama3_json_calls() -> None:
    parsed = LLAMA3_JSON.parse(' {"name": "add", "parameters": {"a": 1}}; {"name": "x"}')
    assert parsed == [("add", {"a": 1}), ("x", {})]
    assert LLAMA3_JSON.start("  {") == 2 and LLAMA3_JSON.start("Hi {") is None


def test_streams_send_content_then_whole_calls() -> None:
    calls = _calls()
    pieces = [HERMES_OUTPUT[i : i + 5] for i in range(0, len(HERMES_OUTPUT), 5)]
    content, deltas, finish = "", [], None
    for i, piece in enumerate(pieces):
        text, new, reason = calls.delta(0, piece, "stop" if i == len(pieces) - 1 else None)
        content += text or ""
        deltas += new or []
        finish = reason or finish
        assert "<" not in content  # a tool call's opener is never sent as content
    assert content.strip() == "Let me check."
    assert [d.function.name for d in deltas] == ["get_weather", "add"]
    assert finish == "tool_calls"


def test_named_function_streams_its_arguments() -> None:
    calls = _calls({"type": "function", "function": {"name": "add"}})
    first = calls.delta(0, '{"a": ', None)[1]
    last = calls.delta(0, "1}", "stop")
    assert first is not None and first[0].id and first[0].function.name == "add"
    assert last[1] is not None and last[1][0].id is None
    assert last[1][0].function.arguments == "1}" and last[2] == "tool_calls"


def test_required_parses_the_constrained_array() -> None:
    message = _calls("required").message('[{"name": "add", "arguments": {"a": 1}}]', "stop")
    assert message.tool_calls is not None and message.tool_calls[0].function.name == "add"
    cut = _calls("required").message('[{"name": "ad', "length")
    assert cut.tool_calls is None and cut.finish_reason == "length"


def test_templates_without_tools_get_them_in_the_system_prompt() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "21 C", "tool_call_id": "1"},
    ]  # fmt: skip
    rendered, tools = render(messages, TOOLS, "{{ messages }}")
    assert tools is None
    assert rendered[0]["role"] == "system" and "get_weather" in rendered[0]["content"]
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        in (rendered[2]["content"])
    )
    assert rendered[3] == {"role": "user", "content": "<tool_response>\n21 C\n</tool_response>"}
    native, passed = render(messages, TOOLS, "{% if tools %}{% endif %}")
    assert passed == TOOLS
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
