"""Streamed chunks as JSON text, built from a per-request template instead of pydantic models.

A busy server writes one chunk per stream per step (thousands a second); building the
response models and serializing them cost the event loop more than the rest of a chunk's
trip. A chunk's envelope (``id``, ``object``, ``created``, ``model``) is the same for the
whole stream, so it is written once, and each chunk fills in its choices. The text is the
same JSON the models in ``openai/protocol.py`` serialize to (same fields, same order; the
tests compare them); logprobs, rare and nested, still go through their models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring

from pydantic import BaseModel

# Compact and UTF-8, like pydantic's ``model_dump_json``.
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _string(value: str | None) -> str:
    """``dumps(value)`` without the encoder's detour through ``iterencode`` for None (the
    ``finish_reason`` of nearly every chunk): the same C function it calls for a str."""
    return "null" if value is None else encode_basestring(value)


@dataclass(frozen=True, slots=True)
class ChunkTemplate:
    """The envelope of one stream's chunks, up to and after its ``choices``."""

    head: str

    @classmethod
    def of(cls, request_id: str, kind: str, created: int, model: str) -> ChunkTemplate:
        head = (
            f'{{"id":{dumps(request_id)},"object":{dumps(kind)},"created":{created},'
            f'"model":{dumps(model)},"choices":['
        )
        return cls(head)

    def chunk(self, choices: str, usage: str = "null") -> str:
        """A chunk with ``choices`` (JSON objects, comma-separated) and ``usage`` (JSON)."""
        return f'{self.head}{choices}],"usage":{usage},"system_fingerprint":null}}'


def completion_choice(
    index: int,
    text: str,
    logprobs: BaseModel | None,
    finish_reason: str | None,
    token_ids: list[int] | None,
) -> str:
    """A ``CompletionChoice`` as JSON."""
    return _choice(index, f'"text":{_string(text)}', logprobs, finish_reason, token_ids)


def chat_chunk_choice(
    index: int,
    delta: str,
    logprobs: BaseModel | None,
    finish_reason: str | None,
    token_ids: list[int] | None,
) -> str:
    """A ``ChatChunkChoice`` as JSON; ``delta``: the ``ChatDelta`` as JSON."""
    return _choice(index, f'"delta":{delta}', logprobs, finish_reason, token_ids)


def _choice(
    index: int,
    content: str,
    logprobs: BaseModel | None,
    finish_reason: str | None,
    token_ids: list[int] | None,
) -> str:
    """A streamed choice; ``content``: its ``"text"`` or ``"delta"`` member as JSON."""
    return (
        f'{{"index":{index},{content},"logprobs":{_model(logprobs)},'
        f'"finish_reason":{_string(finish_reason)}{_token_ids(token_ids)}}}'
    )


def content_delta(text: str) -> str:
    """A ``ChatDelta`` with new content."""
    return f'{{"role":null,"content":{_string(text)}}}'


ROLE_DELTA = '{"role":"assistant","content":""}'  # a chat stream's first delta
# ... when the answer can only be tool calls (a forced call): no text, not even empty text
CALLS_ROLE_DELTA = '{"role":"assistant","content":null}'


def _model(value: BaseModel | None) -> str:
    return "null" if value is None else value.model_dump_json()


def _token_ids(token_ids: list[int] | None) -> str:
    return "" if token_ids is None else f',"token_ids":{dumps(token_ids)}'
