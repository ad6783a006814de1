"""``POST /v1/responses``: OpenAI's Responses API for text, over the chat completions path.

A request becomes a chat completion request (``instructions`` the system message, input
items the conversation, function tools the tools, ``text.format`` the response format,
``max_output_tokens`` the token limit) and runs as one; its output becomes the Responses
API's output items: the model's thoughts (a ``reasoning`` item, with a reasoning parser),
its answer (a ``message`` with ``output_text``) and its tool calls (``function_call``
items). Streamed, it sends the API's typed events (``response.created``, …,
``response.output_text.delta``, …, ``response.completed``).

The server keeps nothing: ``store`` must be false (or absent), and ``previous_response_id``,
``conversation``, a stored ``prompt`` and ``background`` are refused; a client sends the
whole conversation in ``input`` instead. Items sent back ignore fields they do not know, as
chat messages do. ``top_logprobs`` or ``include: ["message.output_text.logprobs"]`` give the
text's logprobs, ``truncation: "auto"`` keeps the end of an input too long for the context
(vLLM's ``truncate_prompt_tokens: -1``), ``max_tool_calls`` bounds the calls returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, model_validator

from infer.contract.outputs import RequestOutput
from infer.server.bridge.engine_client import ChoiceUpdate
from infer.server.http.chat import ChatServing
from infer.server.http.errors import APIError
from infer.server.http.ids import random_hex
from infer.server.http.serving import Context
from infer.server.http.sse import dumps
from infer.server.openai.protocol import (
    MAX_LOGPROBS,
    ChatCompletionRequest,
    ChatLogprobs,
    ChatTokenLogprob,
    JsonSchemaFormat,
    Metadata,
    OpenAIHints,
    ReasoningEffort,
    SamplingRequest,
    ToolCall,
    Usage,
    _Lenient,
    _Request,
    _Response,
    only_function_tools,
)

_STATELESS = "this server keeps no responses (it is stateless)"


class InputText(_Lenient):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # of an earlier output, sent back


class InputMessage(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]
    id: str | None = None  # of an earlier output, sent back
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Lenient):
    """A tool call of an earlier output, sent back."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(_Lenient):
    """A tool's result for ``call_id``."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


class ReasoningItem(_Lenient):
    """Thoughts of an earlier output, sent back: not put into the prompt again (chat
    templates drop earlier turns' thoughts too)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = Annotated[
    InputMessage | FunctionCallItem | FunctionCallOutput | ReasoningItem,
    Field(union_mode="left_to_right"),
]


class FunctionTool(_Request):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Request):
    type: Literal["function"]
    name: str


class TextFormat(_Request):
    """``text.format``: free text, any JSON object, or JSON valid against ``schema``."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_for_json_schema(self) -> TextFormat:
        if (self.type == "json_schema") != (self.schema_ is not None):
            raise ValueError("text.format.schema: required when type is json_schema, and only then")
        return self


class TextOptions(_Request):
    format: TextFormat | None = None  # ``verbosity``: see ``UNSUPPORTED_FIELDS``


class ReasoningOptions(_Request):
    """``reasoning``: ``effort`` reaches the chat template as chat completions'
    ``reasoning_effort`` does; a summary is not written (the thoughts come whole, with a
    reasoning parser), so ``summary`` changes nothing."""

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # its old name


class ResponsesStreamOptions(_Request):
    include_obfuscation: bool | None = None  # these streams are not padded (StreamOptions)


LOGPROBS_INCLUDE = "message.output_text.logprobs"
# What ``include`` may name: the text's logprobs; the rest belongs to items this server never
# returns (built-in tools, images, encrypted thoughts), so there is nothing of them to add.
Includable = Literal[
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
]


class ResponsesRequest(OpenAIHints):
    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Annotated[FunctionTool, BeforeValidator(only_function_tools)]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=0)
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None  # a prompt template stored with OpenAI
    metadata: Metadata | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[Includable] | None = None
    # OpenAI's account programs and image settings: nothing here reads them
    access_programs: dict[str, str] | None = None
    image: dict[str, str] | None = None
    cache_salt: str | None = None  # vLLM's: checked as chat completions check it

    @model_validator(mode="after")
    def _stateless(self) -> ResponsesRequest:
        refused = {
            "store": (self.store, "send store false or omit it"),
            "background": (self.background, "send background false: the answer comes at once"),
            "previous_response_id": (
                self.previous_response_id, "send the whole conversation in input"),
            "conversation": (self.conversation, "send the whole conversation in input"),
            "prompt": (self.prompt, "send the prompt's text as instructions and input"),
        }  # fmt: skip
        for name, (value, instead) in refused.items():
            if value:
                raise ValueError(f"{name}: {_STATELESS}; {instead}")
        if self.max_tool_calls == 0 and self.tool_choice not in (None, "none", "auto"):
            raise ValueError("max_tool_calls: 0 allows no call, but tool_choice forces one")
        return self

    @property
    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None or LOGPROBS_INCLUDE in (self.include or [])

    def as_chat(self) -> ResponsesChat:
        """The chat completion request that answers this one (``ValueError`` naming the
        field when the result is invalid, e.g. ``tool_choice`` naming no tool)."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        items = (
            [InputMessage(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        for item in items:
            _add_message(messages, item)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "user": self.user,
            "parallel_tool_calls": self.parallel_tool_calls,
            "prompt_cache_key": self.prompt_cache_key,
            "reasoning_effort": self.reasoning.effort if self.reasoning is not None else None,
            "cache_salt": self.cache_salt,
        }
        if self.wants_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = self.top_logprobs or 0
        if self.truncation == "auto":  # the end of the input that fits, as OpenAI's drops
            body["truncate_prompt_tokens"] = -1  # the oldest items first
        if self.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": tool.model_dump(exclude={"type"}, exclude_none=True),
                }
                for tool in self.tools
            ]
        if isinstance(self.tool_choice, NamedFunction):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        else:
            body["tool_choice"] = self.tool_choice
        if self.max_tool_calls == 0 and self.tools:
            body["tool_choice"] = "none"
        fmt = self.text.format if self.text is not None else None
        if fmt is not None:
            body["response_format"] = {"type": fmt.type}
            if fmt.schema_ is not None:
                schema = JsonSchemaFormat.model_validate(
                    {
                        "name": fmt.name,
                        "description": fmt.description,
                        "schema": fmt.schema_,
                        "strict": fmt.strict,
                    }
                )
                body["response_format"]["json_schema"] = schema.model_dump(by_alias=True)
        chat = ResponsesChat.model_validate(body)
        chat._origin = self
        return chat


class ResponsesChat(ChatCompletionRequest):
    """The chat completion request that answers a Responses API request."""

    _origin: ResponsesRequest | None = PrivateAttr(None)

    @property
    def origin(self) -> ResponsesRequest:
        assert self._origin is not None
        return self._origin

    @property
    def tool_call_limit(self) -> int | None:
        limits = [super().tool_call_limit, self.origin.max_tool_calls]
        given = [limit for limit in limits if limit is not None]
        return min(given) if given else None


def _add_message(messages: list[dict[str, Any]], item: Any) -> None:
    """An input item as chat messages: a tool call joins the assistant turn before it."""
    if isinstance(item, InputMessage):
        messages.append({"role": item.role, "content": item.text()})
    elif isinstance(item, FunctionCallItem):
        call = {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif isinstance(item, FunctionCallOutput):
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})


# --- the response ---------------------------------------------------------------------------
class OutputText(_Response):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[ChatTokenLogprob] = Field(default_factory=list)  # when asked for


class OutputMessage(_Response):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class ReasoningText(_Response):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(_Response):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


class OutputFunctionCall(_Response):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = OutputMessage | OutputReasoning | OutputFunctionCall


class InputTokensDetails(_Response):
    cached_tokens: int = 0


class OutputTokensDetails(_Response):
    reasoning_tokens: int = 0


class ResponseUsage(_Response):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(_Response):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(_Response):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    incomplete_details: IncompleteDetails | None = None
    error: dict[str, Any] | None = None
    model: str
    output: list[OutputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]]
    tool_choice: Any
    parallel_tool_calls: bool
    max_tool_calls: int | None = None
    text: dict[str, Any]
    reasoning: dict[str, Any]
    top_logprobs: int | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    previous_response_id: None = None
    store: bool = False
    background: bool = False
    service_tier: Literal["default"] = "default"  # the one tier here, whatever was asked
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponseUsage | None = None


@dataclass
class _Stream:
    """What a streamed response has sent: its items so far, and the next event's number."""

    request: ResponsesRequest
    sequence: int = 0
    finish_reason: str | None = None
    held_logprobs: list[ChatTokenLogprob] = field(default_factory=list)  # of held-back text
    reasoning: OutputReasoning | None = None
    message: OutputMessage | None = None
    calls: list[OutputFunctionCall] = field(default_factory=list)

    @property
    def items(self) -> list[OutputItem]:
        return [i for i in (self.reasoning, self.message) if i is not None] + [*self.calls]


class ResponsesServing(ChatServing):
    id_prefix = "resp"
    chunk_object = "response"
    prompt_field = "input"
    stream_done = ""  # the Responses API ends with response.completed, no [DONE]

    async def create_response(self, request: ResponsesRequest, raw: Any) -> Any:
        try:
            chat = request.as_chat()
        except ValueError as exc:
            raise APIError.bad_request(exc) from exc
        return await self.create(chat, raw)

    def stream_state(self, request: SamplingRequest) -> _Stream:
        assert isinstance(request, ResponsesChat)
        return _Stream(request.origin)

    def frame(self, chunk: str) -> str:
        return chunk  # whole events already (each names its type)

    def stream_start(self, ctx: Context) -> list[str]:
        state: _Stream = ctx.stream_state
        response = self._response(ctx, state.request, [], "in_progress", None)
        return [
            self._event(ctx, "response.created", response=response),
            self._event(ctx, "response.in_progress", response=response),
        ]

    def chunk(self, ctx: Context, index: int, update: ChoiceUpdate) -> str | None:
        state: _Stream = ctx.stream_state
        part = self.delta(ctx, index, update)
        state.finish_reason = part.finish_reason
        events: list[str] = []
        if part.reasoning:
            if state.reasoning is None:
                state.reasoning = OutputReasoning(
                    id=_item_id("rs"), content=[ReasoningText(text="")], status="in_progress"
                )
                events.append(self._item_added(ctx, state, state.reasoning))
            state.reasoning.content[0].text += part.reasoning
            kind = "response.reasoning_text.delta"
            events.append(self._text_delta(ctx, state, state.reasoning, kind, part.reasoning))
        scored = self._logprobs(ctx, update.logprobs)
        logprobs = [*state.held_logprobs, *(scored.content if scored is not None else [])]
        state.held_logprobs = [] if part.content or part.reasoning or part.tool_calls else logprobs
        if part.content:
            if state.message is None:
                events += self._start_message(ctx, state)
            assert state.message is not None
            state.message.content[0].text += part.content
            state.message.content[0].logprobs += logprobs
            kind = "response.output_text.delta"
            dumped = [entry.model_dump(mode="json") for entry in logprobs]
            events.append(
                self._text_delta(ctx, state, state.message, kind, part.content, logprobs=dumped)
            )
        for call in part.tool_calls or []:
            if call.id is not None:  # a new call: its name first, then its arguments
                state.calls.append(
                    OutputFunctionCall(
                        id=_item_id("fc"),
                        call_id=call.id,
                        name=call.function.name or "",
                        arguments="",
                        status="in_progress",
                    )
                )
                events.append(self._item_added(ctx, state, state.calls[-1]))
            current = state.calls[call.index]
            if call.function.arguments:
                current.arguments += call.function.arguments
                events.append(
                    self._event(
                        ctx,
                        "response.function_call_arguments.delta",
                        **self._at(state, current),
                        delta=call.function.arguments,
                    )
                )
        return "".join(events) or None

    def stream_end(self, ctx: Context) -> list[str]:
        state: _Stream = ctx.stream_state
        events = []
        if state.reasoning is not None:
            text = state.reasoning.content[0].text
            events.append(
                self._event(
                    ctx,
                    "response.reasoning_text.done",
                    **self._at(state, state.reasoning),
                    content_index=0,
                    text=text,
                )
            )
            events.append(self._item_done(ctx, state, state.reasoning))
        if state.message is not None:
            part = state.message.content[0]
            at = self._at(state, state.message)
            events.append(
                self._event(
                    ctx,
                    "response.output_text.done",
                    **at,
                    content_index=0,
                    text=part.text,
                    logprobs=[entry.model_dump(mode="json") for entry in part.logprobs],
                )
            )
            events.append(
                self._event(ctx, "response.content_part.done", **at, content_index=0, part=part)
            )
            events.append(self._item_done(ctx, state, state.message))
        for call in state.calls:
            events.append(
                self._event(
                    ctx,
                    "response.function_call_arguments.done",
                    **self._at(state, call),
                    name=call.name,
                    arguments=call.arguments,
                )
            )
            events.append(self._item_done(ctx, state, call))
        status = _status(state.finish_reason)
        response = self._response(ctx, state.request, state.items, status, ctx.usage())
        events.append(self._event(ctx, f"response.{status}", response=response))
        return events

    def error_chunk(self, ctx: Context, error: APIError) -> str:
        return self._event(
            ctx, "error", code=error.info.code, message=error.info.message, param=error.info.param
        )

    def response(self, ctx: Context, finals: list[RequestOutput]) -> str:
        state: _Stream = ctx.stream_state
        (out,) = finals
        message, finish_reason = self.message(ctx, out)
        items: list[OutputItem] = []
        status = _status(finish_reason)
        if message.reasoning_content:
            thoughts = ReasoningText(text=message.reasoning_content)
            items.append(OutputReasoning(id=_item_id("rs"), content=[thoughts], status=status))
        if message.content:
            scored = self._logprobs(ctx, out.logprobs)
            logprobs = _logprobs_of(message.content, out.text, scored)
            text = OutputText(text=message.content, logprobs=logprobs)
            items.append(OutputMessage(id=_item_id("msg"), status=status, content=[text]))
        items += [_function_call(call) for call in message.tool_calls or []]
        return self._response(ctx, state.request, items, status, ctx.usage()).model_dump_json()

    # --- building blocks -----------------------------------------------------------------
    def _response(
        self,
        ctx: Context,
        request: ResponsesRequest,
        output: list[OutputItem],
        status: Status,
        usage: Usage | None,
    ) -> ResponseObject:
        fmt = request.text.format if request.text is not None else None
        return ResponseObject(
            id=ctx.request_id,
            created_at=ctx.created,
            status=status,
            incomplete_details=(
                IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
            ),
            model=ctx.model,
            output=output,
            instructions=request.instructions,
            max_output_tokens=request.max_output_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            tools=[tool.model_dump(exclude_none=True) for tool in request.tools or []],
            tool_choice=(
                request.tool_choice.model_dump()
                if isinstance(request.tool_choice, NamedFunction)
                else request.tool_choice or "auto"
            ),
            parallel_tool_calls=request.parallel_tool_calls is not False,
            max_tool_calls=request.max_tool_calls,
            text={
                "format": fmt.model_dump(by_alias=True, exclude_none=True)
                if fmt
                else {"type": "text"},
                "verbosity": "medium",
            },
            reasoning={
                "effort": request.reasoning.effort if request.reasoning else None,
                "summary": request.reasoning.summary if request.reasoning else None,
            },
            top_logprobs=request.top_logprobs,
            truncation=request.truncation or "disabled",
            prompt_cache_key=request.prompt_cache_key,
            safety_identifier=request.safety_identifier,
            metadata=request.metadata or {},
            usage=None
            if usage is None
            else ResponseUsage(
                input_tokens=usage.prompt_tokens,
                input_tokens_details=InputTokensDetails(
                    cached_tokens=usage.prompt_tokens_details.cached_tokens
                ),
                output_tokens=usage.completion_tokens,
                total_tokens=usage.total_tokens,
            ),
        )

    def _start_message(self, ctx: Context, state: _Stream) -> list[str]:
        state.message = OutputMessage(
            id=_item_id("msg"), status="in_progress", content=[OutputText(text="")]
        )
        return [
            self._item_added(ctx, state, state.message),
            self._event(
                ctx,
                "response.content_part.added",
                **self._at(state, state.message),
                content_index=0,
                part=OutputText(text=""),
            ),
        ]

    def _item_added(self, ctx: Context, state: _Stream, item: OutputItem) -> str:
        index = state.items.index(item)
        return self._event(ctx, "response.output_item.added", output_index=index, item=item)

    def _item_done(self, ctx: Context, state: _Stream, item: OutputItem) -> str:
        item.status = _status(state.finish_reason)
        index = state.items.index(item)
        return self._event(ctx, "response.output_item.done", output_index=index, item=item)

    def _text_delta(
        self, ctx: Context, state: _Stream, item: OutputItem, kind: str, delta: str, **extra: Any
    ) -> str:
        """An event with new text of ``item``'s (only) content part."""
        at = self._at(state, item)
        return self._event(ctx, kind, **at, content_index=0, delta=delta, **extra)

    @staticmethod
    def _at(state: _Stream, item: OutputItem) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": state.items.index(item)}

    @staticmethod
    def _event(ctx: Context, kind: str, **fields: Any) -> str:
        state: _Stream = ctx.stream_state
        body = {"type": kind, "sequence_number": state.sequence}
        state.sequence += 1
        for name, value in fields.items():
            body[name] = value.model_dump(mode="json") if isinstance(value, _Response) else value
        return f"event: {kind}\ndata: {dumps(body)}\n\n"


Status = Literal["in_progress", "completed", "incomplete"]


def _status(finish_reason: str | None) -> Status:
    """A finished response's: cut by its token limit, or complete."""
    return "incomplete" if finish_reason == "length" else "completed"


def _logprobs_of(text: str, output: str, scored: ChatLogprobs | None) -> list[ChatTokenLogprob]:
    """The logprobs of the tokens that wrote ``text``, a part of the whole ``output`` (the
    answer after the thoughts, or before the tool calls)."""
    if scored is None:
        return []
    start = max(output.find(text), 0)
    end, offset, picked = start + len(text), 0, []
    for entry in scored.content:
        if offset < end and offset + len(entry.token) > start:
            picked.append(entry)
        offset += len(entry.token)
    return picked


def _function_call(call: ToolCall) -> OutputFunctionCall:
    return OutputFunctionCall(
        id=_item_id("fc"),
        call_id=call.id,
        name=call.function.name,
        arguments=call.function.arguments,
        status="completed",
    )


def _item_id(prefix: str) -> str:
    return f"{prefix}_{random_hex(24)}"
