"""Tool calls read from JSON text as the model writes it, so a stream can send each call's
name as soon as it is written and then its arguments piece by piece.

A call is a JSON object at the top level or in a top-level array: Hermes bodies
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, the tags skipped), Llama 3's
``{"name": ..., "parameters": ...}`` and the array a forced call writes. The scanner only
follows the structure (strings, nesting, where values begin and end): an output cut off by
``max_tokens`` still yields its last call, as far as it was written. Each character is
read once, however the text arrives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_VALUE_ENDS = ",}] \t\r\n"


@dataclass
class ScannedCall:
    """One call as written so far: offsets into the scanner's text."""

    name: str | None = None  # once its string is complete
    name_start: int | None = None  # where the name's string begins (its quote)
    arguments_start: int | None = None
    arguments_end: int | None = None  # None: still being written
    arguments_quoted: bool = False  # arguments written as a JSON string
    closed: bool = False  # the call's object is complete

    def arguments(self, text: str) -> str:
        """The arguments as written so far: the JSON text of the value (its decoded text when
        written as a string, once complete), ``{}`` for a complete call without any."""
        if self.arguments_start is None:
            return "{}" if self.closed else ""
        if self.arguments_quoted:
            if self.arguments_end is None:
                return ""
            try:
                decoded = json.loads(text[self.arguments_start : self.arguments_end])
            except ValueError:
                return ""
            return decoded if isinstance(decoded, str) else ""
        end = len(text) if self.arguments_end is None else self.arguments_end
        return text[self.arguments_start : end]

    def name_prefix(self, text: str) -> str | None:
        """What was written of a name cut off before its closing quote."""
        if self.name is not None or self.name_start is None:
            return None
        return text[self.name_start + 1 :]


class CallScanner:
    """Scans the text of tool calls as it grows (``feed``) until it ends (``finish``)."""

    def __init__(self, arguments_key: str = "arguments") -> None:
        self.arguments_key = arguments_key
        self.text = ""
        self.calls: list[ScannedCall] = []
        self._stack: list[str] = []  # the open containers, "{" or "["
        self._key_next: list[bool] = []  # per open container: an object's next string is a key
        self._string_start: int | None = None
        self._string_is_key = False
        self._escaped = False
        self._call: ScannedCall | None = None
        self._call_depth = 0
        self._key: str | None = None  # the call's member being written
        self._value_start: int | None = None  # where that member's value began
        self._primitive = False  # that value is a number, true, false or null

    def feed(self, text: str) -> None:
        start = len(self.text)
        self.text += text
        for index in range(start, len(self.text)):
            self._read(self.text[index], index)

    def finish(self) -> None:
        """The text is complete: a number or literal still open ends with it."""
        if self._primitive:
            self._end_value(len(self.text))

    def _read(self, char: str, index: int) -> None:
        if self._string_start is not None:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._close_string(index)
            return
        if self._primitive and char in _VALUE_ENDS:
            self._end_value(index)
        if char == '"':
            self._string_start = index
            self._string_is_key = bool(self._key_next) and self._key_next[-1]
            if not self._string_is_key and self._at_call_level():
                self._begin_value(index, quoted=True)
        elif char in "{[":
            if char == "{" and self._stack in ([], ["["]):
                self._call = ScannedCall()
                self.calls.append(self._call)
                self._call_depth = len(self._stack) + 1
                self._key = None
            elif self._at_call_level():
                self._begin_value(index, quoted=False)
            self._stack.append(char)
            self._key_next.append(char == "{")
        elif char in "}]":
            if self._stack:
                self._stack.pop()
                self._key_next.pop()
            if self._call is not None and len(self._stack) < self._call_depth:
                self._call.closed = True
                self._call = None
            elif self._at_call_level() and self._value_start is not None:
                self._end_value(index + 1)
        elif char == ",":
            if self._key_next and self._stack[-1] == "{":
                self._key_next[-1] = True
        elif self._begins_literal(char):
            self._begin_value(index, quoted=False)
            self._primitive = True

    def _begins_literal(self, char: str) -> bool:
        """Whether ``char`` begins a call member's number or literal (true, false, null)."""
        return (
            self._value_start is None
            and char != ":"
            and not char.isspace()
            and self._at_call_level()
        )

    def _at_call_level(self) -> bool:
        return self._call is not None and len(self._stack) == self._call_depth

    def _close_string(self, index: int) -> None:
        start, self._string_start = self._string_start, None
        assert start is not None
        if self._string_is_key:
            self._key_next[-1] = False
            if self._at_call_level():
                key = _decoded(self.text[start : index + 1])
                self._key = key if isinstance(key, str) else None
        elif self._at_call_level() and self._value_start == start:
            self._end_value(index + 1)

    def _begin_value(self, index: int, *, quoted: bool) -> None:
        call = self._call
        assert call is not None
        self._value_start = index
        if self._key == "name" and quoted:
            call.name_start = index
        elif self._key == self.arguments_key:
            call.arguments_start = index
            call.arguments_quoted = quoted

    def _end_value(self, end: int) -> None:
        call = self._call
        start, self._value_start, self._primitive = self._value_start, None, False
        if call is None or start is None:
            return
        if self._key == "name" and call.name_start == start:
            name = _decoded(self.text[start:end])
            call.name = name if isinstance(name, str) else None
        elif self._key == self.arguments_key and call.arguments_start == start:
            call.arguments_end = end


def _decoded(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None
