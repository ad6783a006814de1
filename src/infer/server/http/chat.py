"""``POST /v1/chat/completions``: conversations through the model's chat template, with
tools (``openai/tool_calls.py``) when the request declares them and the model's thoughts apart
from its answer with a reasoning parser (``openai/reasoning.py``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from jinja2 import TemplateError

from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.contract.sampling_params import SamplingParams, StructuredOutputsParams
from infer.server.bridge.engine_client import ChoiceUpdate, EngineClient
from infer.server.guards.retry_after import RetryAfterEstimator
from infer.server.http.metrics import ServerMetrics
from infer.server.http.prompt_batcher import OnEncoded, PromptOptions
from infer.server.http.serving import Context, Guards, OpenAIServing
from infer.server.http.sse import CALLS_ROLE_DELTA, ROLE_DELTA, chat_chunk_choice, content_delta
from infer.server.openai.logprobs import LogprobFormatter
from infer.server.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatResponseMessage,
    Conversation,
    DeltaToolCall,
    SamplingRequest,
)
from infer.server.openai.reasoning import THINK_END, Reasoning, ReasoningParser
from infer.server.openai.tool_calls import ToolCalls, render


@dataclass(frozen=True)
class Delta:
    """A streamed choice's new text, split: thoughts, answer, tool calls."""

    reasoning: str
    content: str
    tool_calls: list[DeltaToolCall] | None
    finish_reason: str | None

    @property
    def empty(self) -> bool:
        return not (self.reasoning or self.content or self.tool_calls or self.finish_reason)


@dataclass(frozen=True)
class ChatOptions:
    """The server's chat settings: how answers are read (``--reasoning-parser``), and
    whether requests may bring their own chat template (``--trust-request-chat-template``:
    a template is code the server runs, so vLLM refuses them by default too)."""

    reasoning_parser: ReasoningParser | None = None
    trust_request_chat_template: bool = False


DEFAULT_CHAT_OPTIONS = ChatOptions()


class ChatServing(OpenAIServing):
    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"
    prompt_field = "messages"

    def __init__(
        self,
        engine: EngineClient,
        model_name: str,
        metrics: ServerMetrics,
        logprobs: LogprobFormatter,
        retry_after: RetryAfterEstimator,
        guards: Guards,
        options: ChatOptions = DEFAULT_CHAT_OPTIONS,
    ) -> None:
        super().__init__(engine, model_name, metrics, logprobs, retry_after, guards)
        self.reasoning_parser = options.reasoning_parser
        self.trust_request_chat_template = options.trust_request_chat_template

    def num_prompts(self, request: SamplingRequest) -> int:
        return 1

    async def encode(
        self, request: SamplingRequest, on_encoded: OnEncoded, keep_last: int | None
    ) -> list[list[int]]:
        assert isinstance(request, ChatCompletionRequest)
        special = request.add_special_tokens is True
        return await self.encode_conversation(request, on_encoded, special, keep_last)

    async def encode_conversation(
        self,
        request: Conversation,
        on_encoded: OnEncoded | None = None,
        add_special_tokens: bool = False,
        keep_last: int | None = None,
    ) -> list[list[int]]:
        """A conversation's token ids through the chat template (tools rendered by
        ``tool_calls.render`` for templates that know none), as ``encode`` gives them."""
        if request.chat_template is not None and not self.trust_request_chat_template:
            raise ValueError(
                "chat_template: this server does not render templates sent in requests (a "
                "template runs code on the server); start it with "
                "--trust-request-chat-template, or use the model's own template"
            )
        tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
        template = request.chat_template or self._template()
        messages, tools_for_template = render(
            [message.for_template() for message in request.messages], tools, template
        )
        options = PromptOptions(add_special_tokens, keep_last, request.template_args())
        try:
            return await self.engine.encode_chat(messages, tools_for_template, on_encoded, options)
        except TemplateError as exc:
            field = self._rejected_field(request, messages, tools_for_template, options)
            raise ValueError(f"{field}: the chat template rejected it: {exc}") from exc

    def _rejected_field(
        self,
        request: Conversation,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: PromptOptions,
    ) -> str:
        """The field whose content the chat template refused: the first tool it refuses on
        its own (``tools.N``), else the template the request sent, else the messages.
        (Rendered again, on this error's path only.)"""
        tokenizer = self.engine.prompts.tokenizer
        assert tokenizer is not None  # it rendered them
        blamed = "messages" if request.chat_template is None else "chat_template"
        for index, tool in enumerate([None, *(tools or [])]):
            try:
                tokenizer.render_chat(messages, None if tool is None else [tool], options.template)
            except TemplateError:
                return blamed if tool is None else f"tools.{index - 1}"
        return blamed

    def sampling_params(
        self, request: SamplingRequest, constraint: StructuredOutputsParams | None
    ) -> SamplingParams:
        assert isinstance(request, ChatCompletionRequest)
        max_tokens, logprobs = request.requested_max_tokens, request.num_logprobs
        params = request.sampling_params(max_tokens, logprobs, constraint)
        reasoning = self._reasoning(request)
        if constraint is None or reasoning is None or not reasoning.thinking:
            return params
        assert self.reasoning_parser is not None
        tokenizer = self.engine.prompts.tokenizer
        tags_are_tokens = tokenizer is not None and THINK_END in tokenizer.hf.get_added_vocab()
        thinking_first = self.reasoning_parser.after_thinking(constraint, tags_are_tokens)
        return replace(params, structured_outputs=thinking_first)

    def tool_calls(self, request: SamplingRequest) -> ToolCalls | None:
        assert isinstance(request, ChatCompletionRequest)
        return ToolCalls.of(request, request.chat_template or self._template())

    def reasoning(self, request: SamplingRequest) -> Reasoning | None:
        assert isinstance(request, ChatCompletionRequest)
        return self._reasoning(request)

    def _reasoning(self, request: ChatCompletionRequest) -> Reasoning | None:
        if self.reasoning_parser is None:
            return None
        return Reasoning(self.reasoning_parser.thinks(request.template_args().kwargs))

    def _template(self) -> str | None:
        tokenizer = self.engine.prompts.tokenizer
        return None if tokenizer is None else tokenizer.hf.chat_template

    def stream_start(self, ctx: Context) -> list[str]:
        forced = ctx.tool_calls is not None and not ctx.tool_calls.opens_with_content
        delta = CALLS_ROLE_DELTA if forced else ROLE_DELTA
        return [
            ctx.template.chunk(chat_chunk_choice(i, delta, None, None, None))
            for i in range(ctx.num_choices)
        ]

    def chunk(self, ctx: Context, index: int, update: ChoiceUpdate) -> str | None:
        if not (update.token_ids or update.final):
            return None
        if ctx.tool_calls is None and ctx.reasoning is None:
            delta, finish_reason = content_delta(update.text), update.finish_reason
        else:  # rare enough for the response models
            part = self.delta(ctx, index, update)
            if part.empty and ctx.tool_calls is not None and not self._per_token(ctx):
                return None  # text held back (a call's name being written): nothing to say
            delta = ChatDelta(
                content=part.content or None,
                reasoning_content=part.reasoning or None,
                tool_calls=part.tool_calls,
            ).model_dump_json()
            finish_reason = part.finish_reason
        choice = chat_chunk_choice(
            index,
            delta,
            self._logprobs(ctx, update.logprobs),
            finish_reason,
            ctx.token_ids(update.token_ids),
        )
        return ctx.template.chunk(choice, ctx.chunk_usage())

    def delta(self, ctx: Context, index: int, update: ChoiceUpdate) -> Delta:
        """What choice ``index`` said since its last chunk: thoughts, answer, tool calls."""
        content, reasoning = update.text, ""
        if ctx.reasoning is not None:
            reasoning, content = ctx.reasoning.delta(index, content, update.final is not None)
        finish_reason, calls = update.finish_reason, None
        if ctx.tool_calls is not None:
            said, calls, finish_reason = ctx.tool_calls.delta(index, content, finish_reason)
            content = said or ""
        return Delta(reasoning, content, calls, finish_reason)

    @staticmethod
    def _per_token(ctx: Context) -> bool:
        """Whether each token's chunk carries something of its own (logprobs, ids)."""
        return ctx.num_logprobs is not None or ctx.return_token_ids

    def usage_chunk(self, ctx: Context) -> str:
        return ctx.template.chunk("", ctx.usage().model_dump_json())

    def response(self, ctx: Context, finals: list[RequestOutput]) -> str:
        choices = []
        for index, out in enumerate(finals):
            message, finish_reason = self.message(ctx, out)
            choices.append(
                ChatChoice(
                    index=index,
                    message=message,
                    logprobs=self._logprobs(ctx, out.logprobs),
                    finish_reason=finish_reason,
                    token_ids=ctx.token_ids(out.token_ids),
                )
            )
        return ChatCompletionResponse(
            id=ctx.request_id,
            created=ctx.created,
            model=ctx.model,
            choices=choices,
            usage=ctx.usage(),
        ).model_dump_json()

    def message(self, ctx: Context, out: RequestOutput) -> tuple[ChatResponseMessage, str | None]:
        """What a finished choice said (thoughts, answer, tool calls), and why it stopped."""
        content: str | None = out.text
        reasoning = None
        if ctx.reasoning is not None:
            reasoning, content = ctx.reasoning.split(out.text)
        if ctx.tool_calls is None:
            return ChatResponseMessage(content=content, reasoning_content=reasoning), (
                out.finish_reason
            )
        said = ctx.tool_calls.message(content or "", out.finish_reason)
        message = ChatResponseMessage(
            content=said.content, reasoning_content=reasoning, tool_calls=said.tool_calls
        )
        return message, said.finish_reason

    def _logprobs(self, ctx: Context, entries: list[TokenLogprob]) -> ChatLogprobs | None:
        return None if ctx.num_logprobs is None else self.logprobs.chat(entries)
