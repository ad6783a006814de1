"""Bounds on what one request may make the server do, checked before anything costly:
each a 400 naming the field and the limit (and the ``infer serve`` flag that sets it).

A grammar's cost grows with its size and nesting (the compiler recurses on its structure:
~5,000 chained Lark rules overflowed its stack and took the server down), so grammars,
regexes, JSON schemas and tool schemas are bounded in bytes and depth, choices in number;
what passes is still compiled in a bounded worker (``http/grammar_check.py``). The request body
is bounded as it arrives (``body_limit.py``). Lists are counted before their entries are
validated (``check_counts``, under the limits ``applied`` to the request): validating
100,000 messages held the API process's event loop for a second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not imported at run time: ``infer --help`` reads the defaults
    from starlette.types import ASGIApp, Receive, Scope, Send

    from infer.server.openai.protocol import SamplingRequest

DEFAULT_GRAMMAR_TIMEOUT_S = 10.0
DEFAULT_GRAMMAR_WORKERS = 2

_OPENERS = {"(": ")", "[": "]", "{": "}"}


@dataclass(frozen=True)
class RequestLimits:
    """The bounds; ``flag`` names each one's ``infer serve`` option in the messages."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_grammar_bytes: int = 64 * 1024  # a grammar, regex or JSON schema
    max_grammar_depth: int = 64  # brackets within brackets, or JSON within JSON
    max_choices: int = 1024
    max_tool_schema_bytes: int = 64 * 1024  # all the tools' definitions together
    max_n: int = 128
    max_stop_strings: int = 64
    max_stop_string_bytes: int = 1024
    max_logit_bias: int = 1024  # entries
    max_messages: int = 2048  # a conversation's (OpenAI's own bound)

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")

    @contextmanager
    def applied(self) -> Iterator[None]:
        """These limits for the request models validated meanwhile (``applied_limits``)."""
        token = _APPLIED.set(self)
        try:
            yield
        finally:
            _APPLIED.reset(token)

    def check_counts(self, fields: Mapping[str, Any]) -> None:
        """``ValueError`` naming the first count over its bound, of a request's fields as
        sent (any JSON: what is not a count here is left to validation) or validated."""
        n = fields.get("n")
        if isinstance(n, int) and not isinstance(n, bool):
            self._at_most("n", n, self.max_n, "max_n")
        stop = fields.get("stop")
        if isinstance(stop, list):
            self._at_most("stop", len(stop), self.max_stop_strings, "max_stop_strings")
        bias = fields.get("logit_bias")
        if isinstance(bias, dict):
            self._at_most("logit_bias", len(bias), self.max_logit_bias, "max_logit_bias",
                          "entries")  # fmt: skip
        messages = fields.get("messages")
        if isinstance(messages, list):
            self._at_most("messages", len(messages), self.max_messages, "max_messages",
                          "messages")  # fmt: skip

    def check(self, request: SamplingRequest) -> None:
        """``ValueError`` naming the first field over its bound."""
        self.check_counts(vars(request))
        stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
        for i, string in enumerate(stop):
            size = len(string.encode())
            self._at_most(f"stop.{i}", size, self.max_stop_string_bytes, "max_stop_string_bytes",
                          "bytes")  # fmt: skip
        bias = len(request.logit_bias or {})
        self._at_most("logit_bias", bias, self.max_logit_bias, "max_logit_bias", "entries")
        for field, value in _grammars(request):
            if isinstance(value, list):
                self._at_most(field, len(value), self.max_choices, "max_choices", "choices")
            text = value if isinstance(value, str) else json.dumps(value)
            size = len(text.encode())
            self._at_most(field, size, self.max_grammar_bytes, "max_grammar_bytes", "bytes")
            depth = _depth(value) if not isinstance(value, str) else _bracket_depth(value)
            self._at_most(field, depth, self.max_grammar_depth, "max_grammar_depth",
                          "levels of nesting")  # fmt: skip
        declared = getattr(request, "tools", None)  # chat requests'
        if declared:
            tools = [tool.model_dump(exclude_none=True) for tool in declared]
            size = len(json.dumps(tools).encode())
            self._at_most("tools", size, self.max_tool_schema_bytes, "max_tool_schema_bytes",
                          "bytes")  # fmt: skip
            for i, tool in enumerate(tools):
                depth = _depth(tool)
                self._at_most(f"tools.{i}", depth, self.max_grammar_depth, "max_grammar_depth",
                              "levels of nesting")  # fmt: skip

    @staticmethod
    def _at_most(field: str, value: int, limit: int, name: str, unit: str = "") -> None:
        if value > limit:
            flag = "--" + name.replace("_", "-")
            what = f"{value} {unit}".strip()
            raise ValueError(f"{field}: {what} exceed this server's limit of {limit} ({flag})")


def _grammars(request: SamplingRequest) -> list[tuple[str, Any]]:
    """The request's grammars, regexes, schemas and choice lists, by field."""
    found: list[tuple[str, Any]] = []
    if request.response_format is not None and request.response_format.json_schema is not None:
        found.append(("response_format.json_schema.schema",
                      request.response_format.json_schema.schema_))  # fmt: skip
    so = request.structured_outputs
    if so is not None:
        for kind, value in (("json", so.json_), ("regex", so.regex), ("choice", so.choice),
                            ("grammar", so.grammar)):  # fmt: skip
            if value is not None:
                found.append((f"structured_outputs.{kind}", value))
    for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        value = getattr(request, name)
        if value is not None:
            found.append((name, value))
    return found


def _depth(value: Any) -> int:
    """How deep JSON values nest (iteratively: the value itself may be a bomb)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _bracket_depth(text: str) -> int:
    """How deep brackets nest in a regex or grammar (a JSON schema given as text: its
    objects and arrays); escaped and quoted brackets count too, which only errs safe."""
    depth = deepest = 0
    for char in text:
        if char in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(0, depth - 1)
    return deepest


DEFAULT_LIMITS = RequestLimits()
_APPLIED: ContextVar[RequestLimits] = ContextVar("request_limits", default=DEFAULT_LIMITS)


def applied_limits() -> RequestLimits:
    """The limits of the request being validated: its server's, else the defaults."""
    return _APPLIED.get()


class LimitsApplied:
    """ASGI middleware: each request is validated under its server's ``limits``."""

    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self.limits.applied():
            await self.app(scope, receive, send)
