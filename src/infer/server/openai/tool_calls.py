"""Tool calling for ``/v1/chat/completions``: tools into the prompt, tool calls out of the
output, in each model family's own format.

- Formats: Hermes (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``: Qwen3,
  SmolLM2, Hermes and most ChatML models) and Llama 3.x JSON (``{"name": ...,
  "parameters": ...}``, after ``<|python_tag|>`` or alone). Which one a model writes is read
  from its chat template.
- The prompt: a template that renders ``tools`` gets them (and the conversation's tool calls
  and results) as transformers passes them; one that does not (SmolLM2's) gets the Hermes
  system prompt and the calls and results written out in the Hermes format.
- ``tool_choice``: ``auto`` parses what the model wrote (text that is no tool call stays
  content); ``required`` and a named function are constrained by a grammar built from the
  functions' parameters (``ChatCompletionRequest.constraint``), so their arguments always
  validate: the output is then a JSON array of calls, or the named function's arguments.
  ``none`` returns text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from infer.server.http.ids import random_hex
from infer.server.openai.protocol import (
    ChatCompletionRequest,
    DeltaFunction,
    DeltaToolCall,
    NamedToolChoice,
    ToolCall,
    ToolCallFunction,
)
from infer.server.openai.tool_call_scanner import CallScanner, ScannedCall

HERMES_SYSTEM_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>\n{tools}\n</tools>\nFor each function call, return a JSON object "
    "with the function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass(frozen=True)
class ToolCallFormat:
    """How a model family writes tool calls in its output."""

    name: str
    opener: str  # text that starts a call ("" for formats recognised by their first "{")
    arguments_key: str

    def start(self, text: str) -> int | None:
        """Where the tool calls begin in ``text`` (None: nowhere, so far)."""
        if self.opener:
            index = text.find(self.opener)
            return None if index < 0 else index
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("{") else None

    def held_back(self, text: str) -> int:
        """How many trailing characters of ``text`` (no call in it) may still begin one."""
        if not self.opener:
            return len(text) if not text.strip() else 0
        return partial_tag(text, self.opener)


def partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (but is not all of it):
    text a stream holds back until it knows whether the tag follows."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


HERMES = ToolCallFormat("hermes", "<tool_call>", "arguments")
LLAMA3_JSON = ToolCallFormat("llama3_json", "", "parameters")


def tool_call_format(chat_template: str | None) -> ToolCallFormat:
    """The format a model writes, from its chat template (Hermes when it does not say)."""
    template = chat_template or ""
    if "<tool_call>" not in template and ("<|python_tag|>" in template or "ipython" in template):
        return LLAMA3_JSON
    return HERMES


def template_renders_tools(chat_template: str | None) -> bool:
    return chat_template is not None and "tools" in chat_template


def render(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, chat_template: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The conversation and tools to hand to the chat template. Tool-call arguments become
    objects (templates write them with ``tojson``); for a template that knows nothing of
    tools, the tools go into the system prompt and calls and results into the text."""
    if template_renders_tools(chat_template):
        return [_with_argument_objects(m) for m in messages], tools
    if not tools and not any("tool_calls" in m or m["role"] == "tool" for m in messages):
        return messages, None
    rendered = [_as_hermes_text(m) for m in messages]
    if tools:
        prompt = HERMES_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if rendered and rendered[0]["role"] == "system":
            prompt = f"{rendered[0]['content']}\n\n{prompt}"
            rendered = rendered[1:]
        rendered.insert(0, {"role": "system", "content": prompt})
    return rendered, None


def _with_argument_objects(message: dict[str, Any]) -> dict[str, Any]:
    if "tool_calls" not in message:
        return message
    calls = []
    for call in message["tool_calls"]:
        function = dict(call["function"])
        function["arguments"] = _loads_or_keep(function["arguments"])
        calls.append({**call, "function": function})
    return {**message, "tool_calls": calls}


def _as_hermes_text(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        return {
            "role": "user",
            "content": f"<tool_response>\n{message['content']}\n</tool_response>",
        }
    if "tool_calls" not in message:
        return message
    text = [message["content"]] if message["content"] else []
    for call in message["tool_calls"]:
        function = call["function"]
        body = {"name": function["name"], "arguments": _loads_or_keep(function["arguments"])}
        text.append(f"<tool_call>\n{json.dumps(body)}\n</tool_call>")
    return {"role": "assistant", "content": "\n".join(text)}


def _loads_or_keep(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass
class Message:
    """What a choice says in the end: its text, its tool calls, and why it stopped."""

    content: str | None
    tool_calls: list[ToolCall] | None
    finish_reason: str | None


@dataclass
class _ChoiceStream:
    text: str = ""  # all the output so far
    sent: int = 0  # characters of it sent as content
    scanner: CallScanner | None = None  # past the start of the tool calls
    ids: list[str] = field(default_factory=list)  # of the calls begun, in order
    arguments_sent: list[int] = field(default_factory=list)  # characters, per call


@dataclass
class ToolCalls:
    """A chat request's tool calling: how each choice's output becomes tool calls, whole or
    streamed. Streaming sends content as it comes, holding back text that may begin a call;
    each call goes out as it is written: its id and name once the name is complete, then
    its arguments as they grow. A call cut off by the token limit is returned as far as it
    was written (``finish_reason: length``), streamed or not."""

    mode: str  # "none" | "auto" | "required" | "named"
    format: ToolCallFormat
    names: frozenset[str]
    named: str | None = None
    limit: int | None = None  # the most calls returned (1: no parallel calls)
    _streams: dict[int, _ChoiceStream] = field(default_factory=dict)

    @classmethod
    def of(cls, request: ChatCompletionRequest, chat_template: str | None) -> ToolCalls | None:
        """None when the request declares no tools (its output is plain content)."""
        if not request.tools:
            return None
        choice = request.tool_choice or "auto"
        named = choice.function.name if isinstance(choice, NamedToolChoice) else None
        return cls(
            mode="named" if named is not None else str(choice),
            format=tool_call_format(chat_template),
            names=frozenset(t.function.name for t in request.tools),
            named=named,
            limit=request.tool_call_limit,
        )

    @property
    def opens_with_content(self) -> bool:
        """Whether the output may be text (a stream's first delta then has ``content: ""``;
        one that can only be calls has ``null``, as OpenAI's)."""
        return self.mode in ("none", "auto")

    # --- whole responses ---------------------------------------------------------------
    def message(self, text: str, finish_reason: str | None) -> Message:
        if self.mode == "named":
            assert self.named is not None
            return self._message([(self.named, text)], None, finish_reason)
        start = None if self.mode == "none" else self._start(text)
        if start is None:
            return Message(text, None, finish_reason)
        scanner = self._scanner()
        scanner.feed(text[start:])
        scanner.finish()
        calls = [
            (name, call.arguments(scanner.text)) for name, call in self._calls(scanner, final=True)
        ]
        if not calls:  # a forced call cut off before its name: nothing to return
            return Message(None if self.mode == "required" else text, None, finish_reason)
        return self._message(calls, text[:start].strip() or None, finish_reason)

    def _start(self, text: str) -> int | None:
        return 0 if self.mode == "required" else self.format.start(text)

    def _scanner(self) -> CallScanner:
        """A forced call writes a JSON array of ``{"name", "arguments"}`` (its grammar);
        otherwise the model's own format."""
        key = "arguments" if self.mode == "required" else self.format.arguments_key
        return CallScanner(key)

    def _calls(self, scanner: CallScanner, *, final: bool) -> list[tuple[str, ScannedCall]]:
        """The calls of known functions so far, each with its function's name: once the
        output ends, a forced call's name cut off is read from what was written of it
        (its grammar allows only the functions' names)."""
        calls = []
        for call in scanner.calls:
            name = call.name
            prefix = call.name_prefix(scanner.text)
            if name is None and final and self.mode == "required" and prefix is not None:
                matches = [known for known in self.names if known.startswith(prefix)]
                name = matches[0] if len(matches) == 1 else None
            if name in self.names:
                assert name is not None
                calls.append((name, call))
        return calls[: self.limit]

    def _message(
        self, calls: list[tuple[str, str]], content: str | None, finish_reason: str | None
    ) -> Message:
        tool_calls = [
            ToolCall(id=_call_id(), function=ToolCallFunction(name=name, arguments=arguments))
            for name, arguments in calls
        ]
        return Message(content, tool_calls, _finish(finish_reason))

    # --- streams -----------------------------------------------------------------------
    def delta(
        self, index: int, new_text: str, finish_reason: str | None
    ) -> tuple[str | None, list[DeltaToolCall] | None, str | None]:
        """A choice's next chunk: (content, tool-call deltas, finish reason)."""
        stream = self._streams.setdefault(index, _ChoiceStream())
        stream.text += new_text
        if self.mode == "named":
            return None, self._named_delta(stream, new_text), _finish(finish_reason)
        content = None
        if stream.scanner is None:
            start = None if self.mode == "none" else self._start(stream.text[stream.sent :])
            if start is None:
                end = len(stream.text)
                if finish_reason is None and self.mode != "none":
                    end -= self.format.held_back(stream.text[stream.sent :])
                return self._content(stream, end), None, finish_reason
            content = self._content(stream, stream.sent + start)
            stream.scanner = self._scanner()
            stream.scanner.feed(stream.text[stream.sent :])
        else:
            stream.scanner.feed(new_text)
        if finish_reason is not None:
            stream.scanner.finish()
        deltas = self._call_deltas(stream, final=finish_reason is not None)
        if finish_reason is not None and not stream.ids and self.mode != "required":
            rest = self._content(stream, len(stream.text))  # not a call after all: content
            return (content or "") + (rest or "") or None, None, finish_reason
        reason = _finish(finish_reason) if stream.ids else finish_reason
        return content, deltas or None, reason

    def _call_deltas(self, stream: _ChoiceStream, *, final: bool) -> list[DeltaToolCall]:
        """What the calls wrote since the last chunk: a new call's id and name, then the
        pieces of arguments."""
        assert stream.scanner is not None
        deltas = []
        for position, (name, call) in enumerate(self._calls(stream.scanner, final=final)):
            arguments = call.arguments(stream.scanner.text)
            if position == len(stream.ids):
                stream.ids.append(_call_id())
                stream.arguments_sent.append(len(arguments))
                function = DeltaFunction(name=name, arguments=arguments)
                deltas.append(DeltaToolCall(index=position, id=stream.ids[position],
                                            type="function", function=function))  # fmt: skip
            elif len(arguments) > stream.arguments_sent[position]:
                piece = arguments[stream.arguments_sent[position] :]
                stream.arguments_sent[position] = len(arguments)
                deltas.append(
                    DeltaToolCall(index=position, function=DeltaFunction(arguments=piece))
                )
        return deltas

    def _content(self, stream: _ChoiceStream, end: int) -> str | None:
        text = stream.text[stream.sent : end]
        stream.sent = max(stream.sent, end)
        return text or None

    def _named_delta(self, stream: _ChoiceStream, new_text: str) -> list[DeltaToolCall] | None:
        if stream.ids:
            if not new_text:
                return None
            return [DeltaToolCall(index=0, function=DeltaFunction(arguments=new_text))]
        stream.ids.append(_call_id())
        function = DeltaFunction(name=self.named, arguments=new_text)
        return [DeltaToolCall(index=0, id=stream.ids[0], type="function", function=function)]


def _finish(reason: str | None) -> str | None:
    """A choice that stopped by itself with calls stopped to call them."""
    return "tool_calls" if reason == "stop" else reason


def _call_id() -> str:
    return f"call_{random_hex(24)}"
