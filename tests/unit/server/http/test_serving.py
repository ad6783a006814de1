"""How a sequence the engine ended with an error reaches the client: its own grammar's
failure as a 400 that says what failed, anything else as a generic 500; what the usage
says the prefix cache saved; and how a stream's events are written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.types import Message

from infer.contract.messages import EngineSnapshot
from infer.contract.outputs import RequestOutput
from infer.server.bridge.engine_client import Job
from infer.server.guards.retry_after import RetryAfterEstimator
from infer.server.http.completions import CompletionServing
from infer.server.http.metrics import ServerMetrics
from infer.server.http.serving import (
    Context,
    LastPiece,
    _as_api_error,
    _EventStream,
    _SequenceFailed,
)
from infer.server.http.sse import ChunkTemplate, completion_choice


def test_a_sequence_ended_by_its_grammar_is_a_400_naming_structured_outputs() -> None:
    message = "structured_outputs: the grammar's matcher failed: lexer error: too many expressions"
    error = _as_api_error(_SequenceFailed(message))
    assert error.status == 400
    assert error.info.param == "structured_outputs"
    assert error.info.message == message


def test_a_sequence_failed_by_the_engine_is_a_generic_500() -> None:
    error = _as_api_error(_SequenceFailed("RuntimeError: CUDA error: an illegal memory access"))
    assert error.status == 500
    assert "CUDA" not in error.info.message


def _context(prompt_lengths: list[int], n: int) -> Context:
    ctx = Context(
        request_id="cmpl-1", model="m", created=0, prompt_lengths=prompt_lengths, n=n,
        num_logprobs=None, include_usage=True, continuous_usage=False, return_token_ids=False,
        template=ChunkTemplate.of("cmpl-1", "text_completion", 0, "m"),
    )  # fmt: skip
    ctx.cached_tokens = [None] * ctx.num_choices
    return ctx


def _final(cached: int) -> RequestOutput:
    return RequestOutput("r", [], [], "", [], "", finished=True, num_cached_tokens=cached)


def test_usage_counts_each_prompts_cached_tokens_once_for_its_n_samples() -> None:
    ctx = _context([40, 50], n=2)
    assert ctx.usage().prompt_tokens_details.cached_tokens == 0
    for index, cached in enumerate([0, 32, 48, 48]):  # prompt 0's first sample filled it
        ctx.finished(index, _final(cached))
    usage = ctx.usage()
    assert usage.prompt_tokens == 90
    assert usage.prompt_tokens_details.cached_tokens == 0 + 48


class _Owner:
    request_timeout = None

    def release(self, job: Job) -> None:
        job.closed = True


def _serving() -> CompletionServing:
    serving = object.__new__(CompletionServing)  # _stream needs no engine
    serving.metrics = ServerMetrics(EngineSnapshot)
    serving.retry_after = RetryAfterEstimator()
    return serving


def test_the_last_token_its_usage_and_done_go_out_as_one_piece() -> None:
    """Each piece is one write to the socket; the events are the same as one per piece."""
    serving, ctx = _serving(), _context([3], n=1)
    job = Job(_Owner(), ["r-0"], None)  # type: ignore[arg-type]

    async def pieces() -> list[str]:
        stream = serving._stream(ctx, job)
        job.put(0, ("r-0", [5], "a", []), 1.0)
        first = await anext(stream)
        final = RequestOutput("r-0", [1, 2, 3], [6], "b", [5, 6], "ab", True, "length")
        job.finish(0, final, 2.0)
        return [first] + [piece async for piece in stream]

    first, last = asyncio.run(pieces())
    token = ctx.template.chunk(completion_choice(0, "b", None, "length", None))
    assert last == (
        serving.frame(token) + serving.frame(serving.usage_chunk(ctx)) + "data: [DONE]\n\n"
    )
    assert first == serving.frame(ctx.template.chunk(completion_choice(0, "a", None, None, None)))
    assert '"completion_tokens":2' in last and job.closed
    assert isinstance(last, LastPiece) and not isinstance(first, LastPiece)


def _respond(body: AsyncIterator[str], disconnect_at_once: bool) -> tuple[list[Message], int]:
    """What ``_EventStream`` sends for ``body``, and how often its ``on_close`` ran."""
    sent: list[Message] = []
    closed: list[None] = []

    async def run() -> None:
        done = asyncio.Event()

        async def receive() -> Message:
            if not disconnect_at_once:
                await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)
            if not message.get("more_body", True):
                done.set()

        scope = {"type": "http", "asgi": {"spec_version": "2.3"}}
        await _EventStream(body, lambda: closed.append(None))(scope, receive, send)

    asyncio.run(run())
    return sent, len(closed)


def test_an_event_stream_sends_its_body_and_closes_once() -> None:
    async def body() -> AsyncIterator[str]:
        yield "data: a\n\n"

    sent, closes = _respond(body(), disconnect_at_once=False)
    assert [m.get("body") for m in sent] == [None, b"data: a\n\n", b""] and closes == 1


def test_an_event_streams_last_piece_ends_its_body() -> None:
    """The same bytes as a body ended apart, in one message (one write to the socket)."""

    async def body() -> AsyncIterator[str]:
        yield "data: a\n\n"
        yield LastPiece("data: b\n\ndata: [DONE]\n\n")

    sent, closes = _respond(body(), disconnect_at_once=False)
    assert [(m.get("body"), m.get("more_body")) for m in sent] == [
        (None, None), (b"data: a\n\n", True), (b"data: b\n\ndata: [DONE]\n\n", False)
    ]  # fmt: skip
    assert closes == 1


def test_an_event_stream_stops_when_the_client_goes_away() -> None:
    async def body() -> AsyncIterator[str]:
        await asyncio.sleep(3600)  # a job that would run on
        yield "data: a\n\n"

    sent, closes = _respond(body(), disconnect_at_once=True)
    assert [m["type"] for m in sent] in ([], ["http.response.start"]) and closes == 1


def test_an_event_streams_failure_is_raised() -> None:
    async def body() -> AsyncIterator[str]:
        yield "data: a\n\n"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _respond(body(), disconnect_at_once=False)
