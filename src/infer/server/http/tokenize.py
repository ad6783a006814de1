"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: a prompt or a conversation (through
the chat template, as chat completions render it) to token ids, and token ids to text, in
vLLM's request and response shapes. vLLM's benchmark client calls ``/tokenize`` first.

What a large request costs stays off the event loop, as a large body's parsing does
(``guards/json_body.py``): the text is tokenized in the tokenizer thread (a text too long for the
context is refused before, ``PromptEncoder.check_text_length``), and a long answer (its
token strings, its JSON) is written in a worker thread. ``/detokenize`` takes at most
``max_seq_len`` tokens, counted before they are validated one by one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar, cast

from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from infer.server.http.chat import ChatServing
from infer.server.http.errors import APIError
from infer.server.http.prompt_batcher import PromptOptions
from infer.server.http.serving import check_model
from infer.server.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from infer.tokenizer import Tokenizer

# Answers with more tokens than this are written off the event loop.
INLINE_TOKENS = 4096


class TokenizeServing:
    def __init__(self, chat: ChatServing) -> None:
        self.chat = chat
        self.engine = chat.engine

    async def tokenize(self, body: dict[str, Any]) -> Response:
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
        tokenizer = self._tokenizer() if return_strs else None

        def answer() -> bytes:
            strs = None if tokenizer is None else tokenizer.hf.convert_ids_to_tokens(tokens)
            return (
                TokenizeResponse(
                    count=len(tokens),
                    max_model_len=self.engine.info.max_seq_len,
                    tokens=tokens,
                    token_strs=cast(list[str] | None, strs),
                )
                .model_dump_json()
                .encode()
            )

        return _json(await _off_loop_if_long(answer, len(tokens)))

    async def detokenize(self, body: dict[str, Any]) -> Response:
        tokens = body.get("tokens")
        max_seq_len = self.engine.info.max_seq_len
        if isinstance(tokens, list) and len(tokens) > max_seq_len:
            raise APIError(400, f"tokens: {len(tokens)} tokens are more than a sequence of this "
                           f"server holds (max_seq_len={max_seq_len})", param="tokens")  # fmt: skip
        request = _validated(DetokenizeRequest, body)
        check_model(request.model, self.chat.model_name)
        vocab_size = self.engine.info.vocab_size
        if request.tokens and max(request.tokens) >= vocab_size:
            raise APIError(400, f"tokens: token ids must be in [0, {vocab_size})", param="tokens")
        tokenizer = self._tokenizer()

        def answer() -> bytes:
            text = tokenizer.decode(request.tokens)
            return DetokenizeResponse(prompt=text).model_dump_json().encode()

        return _json(await _off_loop_if_long(answer, len(request.tokens)))

    def _tokenizer(self) -> Tokenizer:
        tokenizer = self.engine.prompts.tokenizer
        if tokenizer is None:
            raise APIError(400, "this model has no tokenizer")
        return tokenizer


async def _off_loop_if_long(answer: Callable[[], bytes], tokens: int) -> bytes:
    return answer() if tokens <= INLINE_TOKENS else await asyncio.to_thread(answer)


def _json(content: bytes) -> Response:
    return Response(content, media_type="application/json")


Body = TypeVar("Body", TokenizeChatRequest, TokenizeCompletionRequest, DetokenizeRequest)


def _validated(kind: type[Body], body: dict[str, Any]) -> Body:
    """The body as ``kind``; a 400 naming the field, as for any other endpoint."""
    try:
        return kind.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc
