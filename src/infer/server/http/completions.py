"""``POST /v1/completions``: plain prompts (text, token ids, or a list of either)."""

from __future__ import annotations

from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.contract.sampling_params import SamplingParams, StructuredOutputsParams
from infer.server.bridge.engine_client import ChoiceUpdate
from infer.server.http.prompt_batcher import OnEncoded, PromptOptions
from infer.server.http.serving import Context, OpenAIServing
from infer.server.http.sse import completion_choice
from infer.server.openai.echo import PromptEcho
from infer.server.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    SamplingRequest,
)


class CompletionServing(OpenAIServing):
    id_prefix = "cmpl"
    chunk_object = "text_completion"
    prompt_field = "prompt"

    def num_prompts(self, request: SamplingRequest) -> int:
        assert isinstance(request, CompletionRequest)
        return len(request.prompts())

    async def encode(
        self, request: SamplingRequest, on_encoded: OnEncoded, keep_last: int | None
    ) -> list[list[int]]:
        assert isinstance(request, CompletionRequest)
        options = PromptOptions(request.add_special_tokens is not False, keep_last)
        return await self.engine.encode_prompts(request.prompts(), on_encoded, options)

    def sampling_params(
        self, request: SamplingRequest, constraint: StructuredOutputsParams | None
    ) -> SamplingParams:
        """With ``max_tokens: 0`` the engine still samples one token (the prefill's), which
        the response leaves out (``PromptEcho``), as vLLM does."""
        assert isinstance(request, CompletionRequest)
        max_tokens = 1 if request.max_tokens == 0 else request.max_tokens
        return request.sampling_params(
            max_tokens, request.logprobs, constraint, request.num_prompt_logprobs
        )

    def prompt_echo(self, request: SamplingRequest) -> PromptEcho | None:
        assert isinstance(request, CompletionRequest)
        return PromptEcho.of(request)

    def chunk(self, ctx: Context, index: int, update: ChoiceUpdate) -> str | None:
        if not (update.token_ids or update.final):
            return None
        logprobs = self._logprobs(ctx, index, update.logprobs)
        token_ids = ctx.token_ids(update.token_ids)
        choice = completion_choice(index, update.text, logprobs, update.finish_reason, token_ids)
        return ctx.template.chunk(choice, ctx.chunk_usage())

    def usage_chunk(self, ctx: Context) -> str:
        return ctx.template.chunk("", ctx.usage().model_dump_json())

    def response(self, ctx: Context, finals: list[RequestOutput]) -> str:
        if ctx.echo is None:
            choices = [
                CompletionChoice(
                    index=index,
                    text=out.text,
                    logprobs=self._logprobs(ctx, index, out.logprobs),
                    finish_reason=out.finish_reason,
                    token_ids=ctx.token_ids(out.token_ids),
                )
                for index, out in enumerate(finals)
            ]
        else:
            choices = [self._echo_choice(ctx, ctx.echo, i, out) for i, out in enumerate(finals)]
            if not ctx.echo.generates:
                ctx.completion_tokens = 0
        return self._body(ctx, choices, with_usage=True).model_dump_json()

    def _echo_choice(
        self, ctx: Context, echo: PromptEcho, index: int, out: RequestOutput
    ) -> CompletionChoice:
        """A choice that returns its prompt (``echo``) or its scores (``prompt_logprobs``)."""
        tokenizer = self.engine.prompts.tokenizer
        logprobs = self._logprobs(ctx, index, out.logprobs)
        return CompletionChoice(
            index=index,
            text=echo.text(index // ctx.n, out, tokenizer),
            logprobs=echo.logprobs(out, logprobs, self.logprobs, ctx.num_logprobs or 0),
            finish_reason=out.finish_reason if echo.generates else "length",
            token_ids=ctx.token_ids(out.token_ids if echo.generates else []),
            prompt_logprobs=echo.scores(out, self.logprobs),
        )

    def _logprobs(
        self, ctx: Context, index: int, entries: list[TokenLogprob]
    ) -> CompletionLogprobs | None:
        if ctx.num_logprobs is None:
            return None
        logprobs = self.logprobs.completion(entries, ctx.text_offsets[index])
        ctx.text_offsets[index] += sum(len(token) for token in logprobs.tokens)
        return logprobs

    @staticmethod
    def _body(
        ctx: Context, choices: list[CompletionChoice], with_usage: bool = False
    ) -> CompletionResponse:
        return CompletionResponse(
            id=ctx.request_id,
            created=ctx.created,
            model=ctx.model,
            choices=choices,
            usage=ctx.usage() if with_usage else None,
        )
