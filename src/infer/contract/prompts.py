"""Prompts and conversations to validated token ids.

Text needs a tokenizer, token ids must be in the vocabulary, a prompt must not be empty and
must leave room to generate. The engine and the server's API process (which validates before
anything reaches the engine) share these rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infer.contract.errors import ContextLengthError
from infer.tokenizer import Message, Tokenizer

Prompt = str | Sequence[int]


class PromptEncoder:
    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len

    def check_text_length(self, text: str, field: str = "prompt") -> None:
        """``ContextLengthError`` for a text too long to fit the context whatever its
        tokens, before the (costly) tokenization: every token stands for at most
        ``max_token_chars`` characters. (Not for a prompt cut to its last tokens.)"""
        if len(text) <= self.max_seq_len or self.tokenizer is None:
            return
        per_token = self.tokenizer.max_token_chars
        if len(text) > self.max_seq_len * per_token:
            raise ContextLengthError(
                f"{field}: {len(text)} characters are more than max_seq_len={self.max_seq_len} "
                f"tokens can hold (a token here stands for at most {per_token} characters)"
            )

    def encode_prompt(
        self, prompt: Prompt, field: str = "prompt", keep_last: int | None = None
    ) -> list[int]:
        """Validated token ids (``ValueError`` naming ``field``, where the prompt came from),
        only the last ``keep_last`` of them when given (vLLM's ``truncate_prompt_tokens``)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{field}: this model has no tokenizer; pass token ids")
            if keep_last is None:
                self.check_text_length(prompt, field)
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = list(map(int, prompt))
            if token_ids and (min(token_ids) < 0 or max(token_ids) >= self.vocab_size):
                raise ValueError(f"{field}: token ids must be in [0, {self.vocab_size})")
        if keep_last is not None:
            token_ids = token_ids[-keep_last:]
        if not token_ids:
            raise ValueError(f"{field}: must not be empty")
        if len(token_ids) >= self.max_seq_len:
            raise ContextLengthError(
                f"{field}: {len(token_ids)} tokens leave no room to generate within "
                f"max_seq_len={self.max_seq_len}"
            )
        return token_ids

    def encode_chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("messages: this model has no tokenizer, so no chat template")
        return self.encode_prompt(self.tokenizer.apply_chat_template(messages, tools), "messages")
