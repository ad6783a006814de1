"""Reading tool calls from JSON text as it grows: names, argument spans, cut-off calls."""

from __future__ import annotations

import itertools

import pytest

from infer.server.openai.tool_call_scanner import CallScanner

TRICKY = (
    '<tool_call>\n{"name": "note", "arguments": {"text": "a \\"}\\" [x]", "n": [1, {"m": -2.5e3}]}}'
    '\n</tool_call>\n<tool_call>{"arguments": true, "name": "flag"}</tool_call>'
)


def _calls(scanner: CallScanner) -> list[tuple[str | None, str, bool]]:
    return [(c.name, c.arguments(scanner.text), c.closed) for c in scanner.calls]


@pytest.mark.parametrize("size", [1, 2, 7, len(TRICKY)])
def test_calls_are_the_same_however_the_text_arrives(size: int) -> None:
    scanner = CallScanner()
    for start in range(0, len(TRICKY), size):
        scanner.feed(TRICKY[start : start + size])
    scanner.finish()
    assert _calls(scanner) == [
        ("note", '{"text": "a \\"}\\" [x]", "n": [1, {"m": -2.5e3}]}', True),
        ("flag", "true", True),  # a key order of its own, a literal for arguments
    ]


def test_the_arguments_grow_as_they_are_written() -> None:
    scanner = CallScanner()
    seen = []
    for char in '[{"name": "add", "arguments": {"a": 12}}]':
        scanner.feed(char)
        if scanner.calls and scanner.calls[0].name is not None:
            seen.append(scanner.calls[0].arguments(scanner.text))
    assert seen[0] == "" and seen[-1] == '{"a": 12}'
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(seen))


def test_a_cut_off_call_keeps_what_was_written() -> None:
    scanner = CallScanner()
    scanner.feed('[{"name": "get_weather", "arguments": {"city": "Par')
    scanner.finish()
    (call,) = scanner.calls
    assert call.name == "get_weather" and not call.closed
    assert call.arguments(scanner.text) == '{"city": "Par'
    cut_name = CallScanner()
    cut_name.feed('[{"name": "get_w')
    cut_name.finish()
    assert cut_name.calls[0].name is None
    assert cut_name.calls[0].name_prefix(cut_name.text) == "get_w"


def test_arguments_written_as_a_string_are_decoded_once_complete() -> None:
    scanner = CallScanner("parameters")
    scanner.feed('{"name": "f", "parameters": "{\\"a\\": 1')
    assert scanner.calls[0].arguments(scanner.text) == ""
    scanner.feed('}"}; {"name": "g", "parameters": 3')
    scanner.finish()
    assert _calls(scanner) == [("f", '{"a": 1}', True), ("g", "3", False)]


def test_a_complete_call_without_arguments_has_an_empty_object() -> None:
    scanner = CallScanner()
    scanner.feed('{"name": "now"}')
    assert _calls(scanner) == [("now", "{}", True)]
    scanner = CallScanner()
    scanner.feed('{"name": 7, "arguments": {}}')
    assert scanner.calls[0].name is None  # not a string: no function of that name
