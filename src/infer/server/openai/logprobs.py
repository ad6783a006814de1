"""The engine's ``TokenLogprob``s in OpenAI's two formats.

Completions (legacy): parallel lists ``tokens``/``token_logprobs``/``top_logprobs``/
``text_offset``, where each ``top_logprobs`` entry maps token text to log-probability and
includes the sampled token (so up to ``logprobs + 1`` entries, as OpenAI documents).
Chat: one object per token with its UTF-8 ``bytes`` and the ``top_logprobs`` alternatives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

from infer.contract.outputs import TokenLogprob
from infer.server.openai.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    PromptLogprob,
    TopLogprob,
)
from infer.tokenizer import Tokenizer


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self._tokenizer = tokenizer
        self.token_text = lru_cache(maxsize=1 << 16)(self._token_text)

    def _token_text(self, token_id: int) -> str:
        if self._tokenizer is None:  # no tokenizer (dummy weights): name the id, like vLLM
            return f"token_id:{token_id}"
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def completion(self, logprobs: Sequence[TokenLogprob], offset: int) -> CompletionLogprobs:
        """``offset``: characters of the choice's text before these tokens."""
        out = CompletionLogprobs()
        for entry in logprobs:
            text = self.token_text(entry.token_id)
            top = {self.token_text(t): lp for t, lp in entry.top.items()}
            top.setdefault(text, entry.logprob)
            out.tokens.append(text)
            out.token_logprobs.append(entry.logprob)
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def echoed_prompt(
        self, token_ids: Sequence[int], scores: Sequence[TokenLogprob | None], wanted: int
    ) -> CompletionLogprobs:
        """An echoed prompt's tokens, from offset 0, with their scores and ``wanted`` top
        alternatives; the first token has none (null)."""
        first = self.token_text(token_ids[0])
        scored = []
        for entry in scores[1:]:
            assert entry is not None  # the prefill scored every later token
            scored.append(replace(entry, top=dict(list(entry.top.items())[:wanted])))
        rest = self.completion(scored, len(first))
        return CompletionLogprobs(
            tokens=[first, *rest.tokens],
            token_logprobs=[None, *rest.token_logprobs],
            top_logprobs=[None, *rest.top_logprobs],
            text_offset=[0, *rest.text_offset],
        )

    def prompt_logprobs(
        self, scores: Sequence[TokenLogprob | None], wanted: int
    ) -> list[dict[str, PromptLogprob] | None]:
        """vLLM's ``prompt_logprobs``: per prompt token, its id and its ``wanted`` top
        alternatives' ids (as strings) to their scores."""
        out: list[dict[str, PromptLogprob] | None] = []
        for entry in scores:
            if entry is None:
                out.append(None)
                continue
            top = list(entry.top.items())[:wanted]
            ranked = {t: PromptLogprob(logprob=lp, rank=i + 1, decoded_token=self.token_text(t))
                      for i, (t, lp) in enumerate(top)}  # fmt: skip
            ranked.setdefault(
                entry.token_id,
                PromptLogprob(
                    logprob=entry.logprob,
                    rank=entry.rank,
                    decoded_token=self.token_text(entry.token_id),
                ),
            )
            out.append({str(t): score for t, score in ranked.items()})
        return out

    def chat(self, logprobs: Sequence[TokenLogprob]) -> ChatLogprobs:
        return ChatLogprobs(
            content=[
                ChatTokenLogprob(
                    **self._top(entry.token_id, entry.logprob).model_dump(),
                    top_logprobs=[self._top(t, lp) for t, lp in entry.top.items()],
                )
                for entry in logprobs
            ]
        )

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        text = self.token_text(token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))
