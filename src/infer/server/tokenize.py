"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: a prompt or a conversation (through
the chat template, as chat completions render it) to token ids, and token ids to text, in
vLLM's request and response shapes. vLLM's benchmark client calls ``/tokenize`` first."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from infer.server.chat import ChatServing
from infer.server.errors import APIError
from infer.server.prompt_batcher import PromptOptions
from infer.server.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from infer.server.serving import check_model
from infer.tokenizer import Tokenizer


class TokenizeServing:
    def __init__(self, chat: ChatServing) -> None:
        self.chat = chat
        self.engine = chat.engine

    async def tokenize(self, body: dict[str, Any]) -> TokenizeResponse:
        """A body with ``messages`` is a conversation, any other a plain prompt."""
        try:
            if "messages" in body:
                chat = _validated(TokenizeChatRequest, body)
                check_model(chat.model, self.chat.model_name)
                encoded = await self.chat.encode_conversation(
                    chat, add_special_tokens=chat.add_special_tokens
                )
                return_strs = chat.return_token_strs
            else:
                plain = _validated(TokenizeCompletionRequest, body)
                check_model(plain.model, self.chat.model_name)
                options = PromptOptions(add_special_tokens=plain.add_special_tokens)
                encoded = await self.engine.encode_prompts([plain.prompt], options=options)
                return_strs = plain.return_token_strs
        except ValueError as exc:
            raise APIError.bad_request(exc) from exc
        tokens = encoded[0]
        strs = self._tokenizer().hf.convert_ids_to_tokens(tokens) if return_strs else None
        return TokenizeResponse(
            count=len(tokens),
            max_model_len=self.engine.info.max_seq_len,
            tokens=tokens,
            token_strs=cast(list[str] | None, strs),
        )

    def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        check_model(request.model, self.chat.model_name)
        vocab_size = self.engine.info.vocab_size
        if request.tokens and max(request.tokens) >= vocab_size:
            raise APIError(400, f"tokens: token ids must be in [0, {vocab_size})", param="tokens")
        return DetokenizeResponse(prompt=self._tokenizer().decode(request.tokens))

    def _tokenizer(self) -> Tokenizer:
        tokenizer = self.engine.prompts.tokenizer
        if tokenizer is None:
            raise APIError(400, "this model has no tokenizer")
        return tokenizer


Body = TypeVar("Body", TokenizeChatRequest, TokenizeCompletionRequest)


def _validated(kind: type[Body], body: dict[str, Any]) -> Body:
    """The body as ``kind``; a 400 naming the field, as for any other endpoint."""
    try:
        return kind.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc
