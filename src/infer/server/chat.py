"""``POST /v1/chat/completions``: conversations through the model's chat template, with
tools (``tool_calls.py``) when the request declares them."""

from __future__ import annotations

from jinja2 import TemplateError

from infer.engine.request import RequestOutput, TokenLogprob
from infer.engine.sampling_params import SamplingParams
from infer.server.async_engine import ChoiceUpdate
from infer.server.prompt_batcher import OnEncoded
from infer.server.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatResponseMessage,
    SamplingRequest,
)
from infer.server.serving import Context, OpenAIServing
from infer.server.sse import ROLE_DELTA, chat_chunk_choice, content_delta
from infer.server.tool_calls import ToolCalls, render


class ChatServing(OpenAIServing):
    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"
    prompt_field = "messages"

    def num_prompts(self, request: SamplingRequest) -> int:
        return 1

    async def encode(self, request: SamplingRequest, on_encoded: OnEncoded) -> list[list[int]]:
        assert isinstance(request, ChatCompletionRequest)
        tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
        messages, tools_for_template = render(
            [message.for_template() for message in request.messages], tools, self._template()
        )
        try:
            return await self.engine.encode_chat(messages, tools_for_template, on_encoded)
        except TemplateError as exc:
            raise ValueError(f"messages: the chat template rejected them: {exc}") from exc

    def sampling_params(self, request: SamplingRequest) -> SamplingParams:
        assert isinstance(request, ChatCompletionRequest)
        return request.sampling_params(request.requested_max_tokens, request.num_logprobs)

    def tool_calls(self, request: SamplingRequest) -> ToolCalls | None:
        assert isinstance(request, ChatCompletionRequest)
        return ToolCalls.of(request, self._template())

    def _template(self) -> str | None:
        tokenizer = self.engine.prompts.tokenizer
        return None if tokenizer is None else tokenizer.hf.chat_template

    def stream_start(self, ctx: Context) -> list[str]:
        return [
            ctx.template.chunk(chat_chunk_choice(i, ROLE_DELTA, None, None, None))
            for i in range(ctx.num_choices)
        ]

    def chunk(self, ctx: Context, index: int, update: ChoiceUpdate) -> str | None:
        if not (update.token_ids or update.final):
            return None
        if ctx.tool_calls is None:
            delta, finish_reason = content_delta(update.text), update.finish_reason
        else:  # rare enough for the response models
            content, calls, finish_reason = ctx.tool_calls.delta(
                index, update.text, update.finish_reason
            )
            delta = ChatDelta(content=content, tool_calls=calls).model_dump_json()
        choice = chat_chunk_choice(
            index,
            delta,
            self._logprobs(ctx, update.logprobs),
            finish_reason,
            ctx.token_ids(update.token_ids),
        )
        return ctx.template.chunk(choice)

    def usage_chunk(self, ctx: Context) -> str:
        return ctx.template.chunk("", ctx.usage().model_dump_json())

    def response(self, ctx: Context, finals: list[RequestOutput]) -> str:
        choices = []
        for index, out in enumerate(finals):
            message = ChatResponseMessage(content=out.text)
            finish_reason = out.finish_reason
            if ctx.tool_calls is not None:
                said = ctx.tool_calls.message(out.text, finish_reason)
                message = ChatResponseMessage(content=said.content, tool_calls=said.tool_calls)
                finish_reason = said.finish_reason
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

    def _logprobs(self, ctx: Context, entries: list[TokenLogprob]) -> ChatLogprobs | None:
        return None if ctx.num_logprobs is None else self.logprobs.chat(entries)
