"""What a completion returns of its prompts: the text (``echo``), the prompt tokens'
logprobs before the completion's (``echo`` with ``logprobs``), vLLM's ``prompt_logprobs``,
and nothing after the prompt with ``max_tokens: 0`` (lm-eval's log-likelihood requests).

The engine scores the prompt in the prefill (``SamplingParams.prompt_logprobs``); here the
finished sequence is turned into OpenAI's and vLLM's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from infer.contract.outputs import RequestOutput
from infer.server.openai.logprobs import LogprobFormatter
from infer.server.openai.protocol import CompletionLogprobs, CompletionRequest, PromptLogprob
from infer.tokenizer import Tokenizer


@dataclass(frozen=True)
class PromptEcho:
    texts: list[str] | None  # the prompts as sent (None: token ids, or truncated)
    echo: bool
    generates: bool  # False for max_tokens 0: the engine's one token is dropped
    prompt_logprobs: int | None  # vLLM's field

    @classmethod
    def of(cls, request: CompletionRequest) -> PromptEcho | None:
        if not request.echo and request.prompt_logprobs is None:
            return None
        prompts = request.prompts()
        as_sent = request.truncate_prompt_tokens is None and isinstance(prompts[0], str)
        return cls(
            texts=[str(p) for p in prompts] if as_sent else None,
            echo=request.echo,
            generates=request.max_tokens != 0,
            prompt_logprobs=request.prompt_logprobs,
        )

    def prompt_text(self, prompt: int, out: RequestOutput, tokenizer: Tokenizer | None) -> str:
        """Prompt ``prompt``'s text: as sent, else its tokens decoded."""
        if self.texts is not None:
            return self.texts[prompt]
        if tokenizer is None:
            return ""
        return tokenizer.decode(out.prompt_token_ids)

    def text(self, prompt: int, out: RequestOutput, tokenizer: Tokenizer | None) -> str:
        """The choice's text: the prompt (with echo), then the completion (unless none)."""
        head = self.prompt_text(prompt, out, tokenizer) if self.echo else ""
        return head + (out.text if self.generates else "")

    def logprobs(
        self,
        out: RequestOutput,
        completion: CompletionLogprobs | None,
        formatter: LogprobFormatter,
        wanted: int,
    ) -> CompletionLogprobs | None:
        """The choice's ``logprobs``: the prompt's tokens first (with echo), then the
        completion's (unless none); ``completion`` is formatted from offset 0."""
        if completion is None or not self.echo:
            return completion if self.generates else _empty(completion)
        assert out.prompt_logprobs is not None
        prompt = formatter.echoed_prompt(out.prompt_token_ids, out.prompt_logprobs, wanted)
        if not self.generates:
            return prompt
        shift = sum(len(token) for token in prompt.tokens)
        return CompletionLogprobs(
            tokens=prompt.tokens + completion.tokens,
            token_logprobs=prompt.token_logprobs + completion.token_logprobs,
            top_logprobs=prompt.top_logprobs + completion.top_logprobs,
            text_offset=prompt.text_offset + [o + shift for o in completion.text_offset],
        )

    def scores(
        self, out: RequestOutput, formatter: LogprobFormatter
    ) -> list[dict[str, PromptLogprob] | None] | None:
        """vLLM's ``prompt_logprobs`` of the choice, when asked for."""
        if self.prompt_logprobs is None:
            return None
        assert out.prompt_logprobs is not None
        return formatter.prompt_logprobs(out.prompt_logprobs, self.prompt_logprobs)


def _empty(logprobs: CompletionLogprobs | None) -> CompletionLogprobs | None:
    return None if logprobs is None else CompletionLogprobs()
