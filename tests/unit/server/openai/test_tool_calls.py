"""Tool-call formats: parsing whole outputs and streams, and rendering conversations."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infer.server.openai.protocol import ChatCompletionRequest, DeltaToolCall
from infer.server.openai.tool_calls import HERMES, LLAMA3_JSON, ToolCalls, render, tool_call_format

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "add"}},
]
HERMES_OUTPUT = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)


def _calls(
    tool_choice: Any = "auto", template: str = "{{ '<tool_call>' }}", **fields: Any
) -> ToolCalls:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
         "tool_choice": tool_choice, **fields}
    )  # fmt: skip
    calls = ToolCalls.of(request, template)
    assert calls is not None
    return calls


def _streamed(calls: ToolCalls, output: str, finish_reason: str, size: int = 3) -> Any:
    """The output in pieces of ``size`` characters through ``calls.delta``: the content sent,
    each chunk's tool-call deltas (empty chunks left out), and the last finish reason."""
    pieces = [output[i : i + size] for i in range(0, len(output), size)]
    content, chunks, finish = "", [], None
    for i, piece in enumerate(pieces):
        text, deltas, reason = calls.delta(
            0, piece, finish_reason if i == len(pieces) - 1 else None
        )
        content += text or ""
        if deltas:
            chunks.append(deltas)
        finish = reason or finish
    return content, chunks, finish


def _joined(chunks: list[list[DeltaToolCall]]) -> list[tuple[str | None, str]]:
    """(name, arguments) per call, as a client joins the deltas (by ``index``)."""
    calls: list[list[Any]] = []
    for deltas in chunks:
        for delta in deltas:
            if delta.id is not None:
                assert delta.index == len(calls)
                calls.append([delta.function.name, ""])
            calls[delta.index][1] += delta.function.arguments or ""
    return [(name, arguments) for name, arguments in calls]


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
    calls = _calls(template="{{ '<|python_tag|>' }}")
    output = ' {"name": "add", "parameters": {"a": 1}}; {"name": "get_weather"}'
    message = calls.message(output, "stop")
    assert message.tool_calls is not None and message.content is None
    parsed = [(c.function.name, c.function.arguments) for c in message.tool_calls]
    assert parsed == [("add", '{"a": 1}'), ("get_weather", "{}")]
    assert LLAMA3_JSON.start("  {") == 2 and LLAMA3_JSON.start("Hi {") is None


def test_streams_send_content_then_each_call_as_it_is_written() -> None:
    content, chunks, finish = _streamed(_calls(), HERMES_OUTPUT, "stop", size=5)
    assert "<" not in content and content.strip() == "Let me check."  # no opener as content
    whole = _calls().message(HERMES_OUTPUT, "stop").tool_calls
    assert whole is not None
    expected = [(call.function.name, call.function.arguments) for call in whole]
    assert _joined(chunks) == expected
    # the name alone first, then the arguments in several pieces
    assert chunks[0][0].function.name == "get_weather" and chunks[0][0].function.arguments == ""
    assert sum(1 for deltas in chunks for d in deltas if d.index == 0) > 3
    assert finish == "tool_calls"


def test_a_forced_call_streams_its_name_then_its_arguments() -> None:
    output = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    content, chunks, finish = _streamed(_calls("required"), output, "stop")
    assert content == "" and finish == "tool_calls"
    assert _joined(chunks) == [("get_weather", '{"city": "Paris"}')]
    assert chunks[0][0].id and chunks[0][0].function.arguments == ""
    assert len(chunks) > 5


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
    assert message.tool_calls[0].function.arguments == '{"a": 1}'
    single = _calls("required", parallel_tool_calls=False).message(
        '[{"name": "add", "arguments": {}}, {"name": "add", "arguments": {}}]', "stop"
    )
    assert single.tool_calls is not None and len(single.tool_calls) == 1


@pytest.mark.parametrize(
    ("output", "name", "arguments"),
    [
        ('[{"name": "get_weather", "arguments": {"city": "Pa', "get_weather", '{"city": "Pa'),
        ('[{"name": "get_w', "get_weather", ""),  # the grammar allows one name only
        ('[{"name": "ad', "add", ""),
    ],
)
def test_a_forced_call_cut_off_by_the_token_limit_is_returned_as_far_as_written(
    output: str, name: str, arguments: str
) -> None:
    cut = _calls("required").message(output, "length")
    assert cut.content is None and cut.finish_reason == "length"
    assert cut.tool_calls is not None
    assert (cut.tool_calls[0].function.name, cut.tool_calls[0].function.arguments) == (
        name,
        arguments,
    )
    content, chunks, finish = _streamed(_calls("required"), output, "length")
    assert content == "" and finish == "length" and _joined(chunks) == [(name, arguments)]
    named = _calls({"type": "function", "function": {"name": "add"}}).message('{"a": ', "length")
    assert named.tool_calls is not None and named.tool_calls[0].function.arguments == '{"a": '
    assert named.finish_reason == "length"


def test_a_forced_call_cut_off_before_its_name_returns_nothing_as_content() -> None:
    cut = _calls("required").message('[{"na', "length")
    assert cut.content is None and cut.tool_calls is None and cut.finish_reason == "length"


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
