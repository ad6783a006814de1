"""Streamed chunks built from templates are the JSON the pydantic response models write,
and the official ``openai`` client parses them."""

from __future__ import annotations

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk as OpenAIChatChunk

from infer.server.http.sse import (
    ROLE_DELTA,
    ChunkTemplate,
    chat_chunk_choice,
    completion_choice,
    content_delta,
)
from infer.server.openai.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Usage,
)

TEXTS = [
    "",
    " tok",
    'quote " backslash \\ newline \n tab \t',
    "naïve café 日本語 🎉",
    "\x00\x1f\x7f\u2028",
]
FINISH = [None, "stop", "length"]
ID, CREATED, MODEL = "cmpl-abc123", 1_700_000_000, "smollm2-135m"


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("finish_reason", FINISH)
@pytest.mark.parametrize("token_ids", [None, [1, 2, 3]])
def test_completion_chunk_is_the_models_json(
    text: str, finish_reason: str | None, token_ids: list[int] | None
) -> None:
    template = ChunkTemplate.of(ID, "text_completion", CREATED, MODEL)
    framed = template.chunk(completion_choice(3, text, None, finish_reason, token_ids))
    choice = CompletionChoice(index=3, text=text, finish_reason=finish_reason, token_ids=token_ids)
    expected = CompletionResponse(id=ID, created=CREATED, model=MODEL, choices=[choice])
    assert framed == expected.model_dump_json()
    if finish_reason is not None:  # the client's model wants one; streaming does not check
        parsed = Completion.model_validate_json(framed)
        assert parsed.choices[0].text == text and parsed.choices[0].finish_reason == finish_reason


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("finish_reason", FINISH)
@pytest.mark.parametrize("token_ids", [None, [7]])
def test_chat_chunk_is_the_models_json(
    text: str, finish_reason: str | None, token_ids: list[int] | None
) -> None:
    template = ChunkTemplate.of(ID, "chat.completion.chunk", CREATED, MODEL)
    framed = template.chunk(
        chat_chunk_choice(0, content_delta(text), None, finish_reason, token_ids)
    )
    choice = ChatChunkChoice(
        index=0, delta=ChatDelta(content=text), finish_reason=finish_reason, token_ids=token_ids
    )
    expected = ChatCompletionChunk(id=ID, created=CREATED, model=MODEL, choices=[choice])
    assert framed == expected.model_dump_json()
    parsed = OpenAIChatChunk.model_validate_json(framed)
    assert parsed.choices[0].delta.content == text


def test_chat_opener_usage_chunk_and_logprobs_are_the_models_json() -> None:
    template = ChunkTemplate.of(ID, "chat.completion.chunk", CREATED, MODEL)
    opener = ChatChunkChoice(index=1, delta=ChatDelta(role="assistant", content=""))
    expected = ChatCompletionChunk(id=ID, created=CREATED, model=MODEL, choices=[opener])
    assert template.chunk(chat_chunk_choice(1, ROLE_DELTA, None, None, None)) == (
        expected.model_dump_json()
    )
    usage = Usage(prompt_tokens=5, completion_tokens=7, total_tokens=12)
    expected = ChatCompletionChunk(id=ID, created=CREATED, model=MODEL, choices=[], usage=usage)
    framed = template.chunk("", usage.model_dump_json())
    assert framed == expected.model_dump_json()
    assert OpenAIChatChunk.model_validate_json(framed).usage is not None

    top = ChatTokenLogprob(token="a", logprob=-0.5, bytes=[97], top_logprobs=[])
    logprobs = ChatLogprobs(content=[top])
    choice = ChatChunkChoice(index=0, delta=ChatDelta(content="a"), logprobs=logprobs)
    expected = ChatCompletionChunk(id=ID, created=CREATED, model=MODEL, choices=[choice])
    framed = template.chunk(chat_chunk_choice(0, content_delta("a"), logprobs, None, None))
    assert framed == expected.model_dump_json()


def test_completion_logprobs_are_the_models_json() -> None:
    template = ChunkTemplate.of(ID, "text_completion", CREATED, MODEL)
    logprobs = CompletionLogprobs(
        tokens=["a"], token_logprobs=[-0.25], top_logprobs=[{"a": -0.25}], text_offset=[4]
    )
    choice = CompletionChoice(index=0, text="a", logprobs=logprobs, finish_reason="stop")
    expected = CompletionResponse(id=ID, created=CREATED, model=MODEL, choices=[choice])
    framed = template.chunk(completion_choice(0, "a", logprobs, "stop", None))
    assert framed == expected.model_dump_json()
    parsed = Completion.model_validate_json(framed).choices[0].logprobs
    assert parsed is not None and parsed.token_logprobs == [-0.25]
