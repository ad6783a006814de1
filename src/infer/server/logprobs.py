"""The engine's ``TokenLogprob``s in OpenAI's two formats.

Completions (legacy): parallel lists ``tokens``/``token_logprobs``/``top_logprobs``/
``text_offset``, where each ``top_logprobs`` entry maps token text to log-probability and
includes the sampled token (so up to ``logprobs + 1`` entries, as OpenAI documents).
Chat: one object per token with its UTF-8 ``bytes`` and the ``top_logprobs`` alternatives.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from infer.engine.request import TokenLogprob
from infer.server.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
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
