"""What both generation endpoints do: validate, expand ``n``, submit, then stream SSE
chunks or collect one response. ``completions.py`` and ``chat.py`` supply the formats.

Everything that can be wrong with a request is found here, before ``submit``: the model
name, types and ranges, prompt encoding and length. Nothing invalid reaches the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from infer.contract.constraints import GRAMMAR_FIELD
from infer.contract.errors import ContextLengthError, QueueFullError
from infer.contract.outputs import RequestOutput
from infer.contract.sampling_params import SamplingParams, StructuredOutputsParams
from infer.server.bridge.engine_client import (
    ENGINE_FAILED,
    ChoiceUpdate,
    EngineClient,
    EngineStoppedError,
    Job,
    RequestTimeoutError,
)
from infer.server.guards.request_limits import RequestLimits
from infer.server.guards.retry_after import RetryAfterEstimator
from infer.server.http.errors import APIError, internal_server_error
from infer.server.http.grammar_check import GrammarChecker, GrammarCheckError
from infer.server.http.ids import random_hex
from infer.server.http.metrics import ServerMetrics
from infer.server.http.prompt_batcher import OnEncoded
from infer.server.http.sse import ChunkTemplate
from infer.server.openai.echo import PromptEcho
from infer.server.openai.logprobs import LogprobFormatter
from infer.server.openai.protocol import PromptTokensDetails, SamplingRequest, Usage
from infer.server.openai.reasoning import Reasoning
from infer.server.openai.tool_calls import ToolCalls

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class Guards:
    """What a request passes before it costs anything: the server's limits, then its
    constraint's check in a worker process."""

    limits: RequestLimits
    grammars: GrammarChecker


@dataclass
class Context:
    """One request as the formatters see it."""

    request_id: str
    model: str
    created: int
    prompt_lengths: list[int]
    n: int
    num_logprobs: int | None
    include_usage: bool
    continuous_usage: bool  # every chunk carries the usage so far
    return_token_ids: bool
    template: ChunkTemplate  # of the stream's chunks
    text_offsets: list[int] = field(default_factory=list)  # per choice, for logprobs
    completion_tokens: int = 0
    # Per choice, once it finished: its prompt tokens served from the prefix cache.
    cached_tokens: list[int | None] = field(default_factory=list)
    tool_calls: ToolCalls | None = None  # chat requests with tools
    reasoning: Reasoning | None = None  # chat requests to a server with a reasoning parser
    stream_state: Any = None  # an endpoint's own state of a stream (the Responses API's)
    echo: PromptEcho | None = None  # completions that return their prompts

    def token_ids(self, ids: list[int]) -> list[int] | None:
        return ids if self.return_token_ids else None

    @property
    def num_choices(self) -> int:
        return len(self.prompt_lengths) * self.n

    def chunk_usage(self) -> str:
        """A streamed chunk's ``usage`` (JSON): the usage so far, or null."""
        return self.usage().model_dump_json() if self.continuous_usage else "null"

    def usage(self) -> Usage:
        prompt_tokens = sum(self.prompt_lengths)
        return Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=prompt_tokens + self.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=self.prompt_cached_tokens()),
        )

    def finished(self, index: int, final: RequestOutput) -> None:
        """Choice ``index`` ended with ``final``: keep what the cache saved it."""
        self.cached_tokens[index] = final.num_cached_tokens

    def prompt_cached_tokens(self) -> int:
        """Prompt tokens served from the cache, each prompt counted once (as in
        ``prompt_tokens``): the fewest of its ``n`` samples that finished, since the first
        one admitted computed what the others then found cached."""
        total = 0
        for start in range(0, len(self.cached_tokens), self.n):
            known = [c for c in self.cached_tokens[start : start + self.n] if c is not None]
            total += min(known, default=0)
        return total


class OpenAIServing(ABC):
    id_prefix: str  # of response ids: "cmpl", "chatcmpl"
    chunk_object: str  # the ``object`` of streamed chunks
    prompt_field: str  # the request field the prompt comes from, for error messages

    def __init__(
        self,
        engine: EngineClient,
        model_name: str,
        metrics: ServerMetrics,
        logprobs: LogprobFormatter,
        retry_after: RetryAfterEstimator,
        guards: Guards,
    ) -> None:
        self.engine = engine
        self.guards = guards
        self.model_name = model_name
        self.metrics = metrics
        self.logprobs = logprobs
        self.retry_after = retry_after
        self.max_seq_len = engine.info.max_seq_len
        # Longer prompts fail at encoding (max_seq_len); this is the pool's capacity.
        self.max_prompt_tokens = engine.info.kv_capacity_tokens

    # --- endpoint formats ----------------------------------------------------------------
    @abstractmethod
    def num_prompts(self, request: SamplingRequest) -> int: ...

    @abstractmethod
    async def encode(
        self, request: SamplingRequest, on_encoded: OnEncoded, keep_last: int | None
    ) -> list[list[int]]:
        """Token ids of each prompt, only the last ``keep_last`` when given (``ValueError``
        naming the field when invalid), after ``on_encoded`` ran on them
        (``EngineClient.encode_prompts``)."""

    @abstractmethod
    def sampling_params(
        self, request: SamplingRequest, constraint: StructuredOutputsParams | None
    ) -> SamplingParams:
        """The request's parameters, with its ``constraint`` (``grammar_check.py``)."""

    def tool_calls(self, request: SamplingRequest) -> ToolCalls | None:
        """How tool calls are read from the output (chat requests with tools)."""
        return None

    def reasoning(self, request: SamplingRequest) -> Reasoning | None:
        """How the model's thoughts are told apart from its answer (chat requests to a
        server with a reasoning parser)."""
        return None

    def prompt_echo(self, request: SamplingRequest) -> PromptEcho | None:
        """What the response returns of the prompts (completions' ``echo``)."""
        return None

    def stream_state(self, request: SamplingRequest) -> Any:
        """The endpoint's own state of the request's stream (``Context.stream_state``)."""
        return None

    def stream_start(self, ctx: Context) -> list[str]:
        """JSON chunks sent before any token."""
        return []

    @abstractmethod
    def chunk(self, ctx: Context, index: int, update: ChoiceUpdate) -> str | None:
        """JSON of the SSE chunk for what choice ``index`` produced since the last one.

        Every new token gets a chunk, even when its text is held back (a stop string may be
        forming) or there is no text at all (no tokenizer), so clients see each token."""

    @abstractmethod
    def usage_chunk(self, ctx: Context) -> str: ...

    def stream_end(self, ctx: Context) -> list[str]:
        """JSON chunks sent after the last token: the usage, when asked for."""
        return [self.usage_chunk(ctx)] if ctx.include_usage else []

    def error_chunk(self, ctx: Context, error: APIError) -> str:
        """What a stream that fails sends (its status is already 200)."""
        return error.json()

    def frame(self, chunk: str) -> str:
        """A chunk as a Server-Sent Event."""
        return f"data: {chunk}\n\n"

    stream_done = "data: [DONE]\n\n"  # the stream's last event

    @abstractmethod
    def response(self, ctx: Context, finals: list[RequestOutput]) -> str:
        """JSON of the whole response, from each choice's final output."""

    # --- the shared flow -----------------------------------------------------------------
    async def create(self, request: SamplingRequest, raw: Request) -> Response:
        try:
            job, ctx = await self._submit(request)
        except APIError as exc:
            self.metrics.rejected.labels(str(exc.status)).inc()
            raise
        if request.stream:
            return _EventStream(self._stream(ctx, job), partial(self._release, job))
        return await self._respond(ctx, job, raw)

    def _release(self, job: Job) -> None:
        """Abort what is left of the job and record its latencies (once)."""
        if not job.closed:
            job.close()
            self.metrics.observe(job)
            self.retry_after.record_finished(len(job.request_ids))

    async def _submit(self, request: SamplingRequest) -> tuple[Job, Context]:
        """Validate, reserve the job's capacity, encode its prompts and start it where they
        were encoded (the tokenizer thread: ``EngineClient.start_job``)."""
        check_model(request.model, self.model_name)
        try:
            self.guards.limits.check(request)
            constraint = await self.guards.grammars.constraint(request)
            params = self.sampling_params(request, constraint)
            if request.allowed_token_ids is not None:
                params = self._only_allowed_tokens(params, request.allowed_token_ids)
            params.check_for_model(self.engine.info.vocab_size, self.max_seq_len)
        except ValueError as exc:
            raise APIError.bad_request(exc) from exc
        except GrammarCheckError as exc:
            raise APIError(503, str(exc), "server_error", code="unavailable") from exc
        # The engine's ids are the server's own: a client's ``request_id`` names only the
        # response (two clients may send the same one).
        job_id = f"{self.id_prefix}-{random_hex(32)}"
        request_id = job_id
        if request.request_id is not None:
            request_id = f"{self.id_prefix}-{request.request_id}"
        job = self._reserve(job_id, self.num_prompts(request) * params.n)
        keep_last = None
        if request.truncate_prompt_tokens is not None:
            keep_last = request.keep_last_tokens(self.max_seq_len, params.max_tokens)
        try:
            prompts = await self.encode(request, partial(self._start, job, params), keep_last)
        except ValueError as exc:
            job.close()
            raise APIError.bad_request(exc) from exc
        except BaseException:
            job.close()
            raise
        created = int(time.time())
        ctx = Context(
            request_id=request_id,
            model=self.model_name,
            created=created,
            prompt_lengths=[len(p) for p in prompts],
            n=params.n,
            num_logprobs=params.logprobs,
            include_usage=request.include_usage,
            continuous_usage=request.continuous_usage,
            return_token_ids=request.return_token_ids,
            template=ChunkTemplate.of(request_id, self.chunk_object, created, self.model_name),
            tool_calls=self.tool_calls(request),
            reasoning=self.reasoning(request),
            stream_state=self.stream_state(request),
            echo=self.prompt_echo(request),
        )
        ctx.text_offsets = [0] * ctx.num_choices
        ctx.cached_tokens = [None] * ctx.num_choices
        return job, ctx

    def _only_allowed_tokens(self, params: SamplingParams, allowed: list[int]) -> SamplingParams:
        """``allowed_token_ids`` restrict every token, the end of the sequence included
        (vLLM's mask): the grammar (``SamplingRequest.constraint``) lets the output end at
        any point, so unless one of the model's end tokens is listed, they are held off
        to the length limit as ``min_tokens`` holds them off."""
        vocab_size = self.engine.info.vocab_size
        if max(allowed) >= vocab_size:
            raise ValueError(f"allowed_token_ids: token ids must be in [0, {vocab_size})")
        if set(allowed) & set(self.engine.info.eos_token_ids):
            return params
        return replace(params, min_tokens=params.max_tokens or self.max_seq_len - 1)

    def _reserve(self, request_id: str, count: int) -> Job:
        try:
            return self.engine.reserve(request_id, count)
        except QueueFullError as exc:
            excess = self.engine.outstanding + count - self.engine.capacity
            raise APIError(
                503,
                f"The server is overloaded ({exc}); retry later",
                "server_error",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after.seconds(excess))},
            ) from exc
        except EngineStoppedError as exc:
            raise _as_api_error(exc) from exc
        except ValueError as exc:
            raise APIError.bad_request(exc) from exc

    def _start(self, job: Job, params: SamplingParams, prompts: list[list[int]]) -> None:
        """Check the encoded prompts against the model's lengths and send the job's
        sequences (``n`` per prompt) to the engine; runs where the prompts were encoded."""
        self._check_lengths(prompts, params.max_tokens)
        self.engine.start_job(
            job, [(p, params.nth_sample(j)) for p in prompts for j in range(params.n)]
        )

    def _check_lengths(self, prompts: list[list[int]], max_tokens: int | None) -> None:
        for prompt in prompts:
            if len(prompt) > self.max_prompt_tokens:
                raise ContextLengthError(
                    f"{self.prompt_field}: {len(prompt)} tokens exceed the KV cache "
                    f"({self.max_prompt_tokens} tokens)"
                )
            if max_tokens is not None and len(prompt) + max_tokens > self.max_seq_len:
                raise ContextLengthError(
                    f"max_tokens: the prompt ({len(prompt)} tokens) plus max_tokens "
                    f"({max_tokens}) exceeds max_seq_len ({self.max_seq_len})"
                )

    async def _stream(self, ctx: Context, job: Job) -> AsyncIterator[str]:
        """The response's SSE events: each batch's in one piece, the last one's with the
        closing events (one write to the socket instead of three)."""
        tail: list[str] = []
        try:
            for opener in self.stream_start(ctx):
                yield self.frame(opener)
            async for batch in job:
                events = []
                for index, update in batch:
                    _raise_if_failed(update.final)
                    ctx.completion_tokens += len(update.token_ids)
                    if update.final is not None:
                        ctx.finished(index, update.final)
                    chunk = self.chunk(ctx, index, update)
                    if chunk is not None:
                        events.append(self.frame(chunk))
                if job.finished:
                    tail = events
                    break
                if events:
                    yield "".join(events)
            tail += [self.frame(closer) for closer in self.stream_end(ctx)]
        except (RequestTimeoutError, EngineStoppedError, _SequenceFailed) as exc:
            tail = [self.frame(self.error_chunk(ctx, _as_api_error(exc)))]
        finally:
            self._release(job)
        if self.stream_done:
            tail.append(self.stream_done)
        if tail:
            yield LastPiece("".join(tail))

    async def _respond(self, ctx: Context, job: Job, raw: Request) -> Response:
        collect = asyncio.ensure_future(self._collect(ctx, job))
        disconnect = asyncio.ensure_future(_wait_for_disconnect(raw))
        try:
            await asyncio.wait({collect, disconnect}, return_when=asyncio.FIRST_COMPLETED)
            if not collect.done():  # the client went away: abort (job.close) and drop it
                return Response(status_code=499)
            try:
                body = collect.result()
            except (RequestTimeoutError, EngineStoppedError, _SequenceFailed) as exc:
                raise _as_api_error(exc) from exc
            return Response(body, media_type="application/json")
        finally:
            collect.cancel()
            disconnect.cancel()
            self._release(job)

    async def _collect(self, ctx: Context, job: Job) -> str:
        finals: list[RequestOutput | None] = [None] * ctx.num_choices
        async for batch in job:
            for index, update in batch:
                final = update.final
                _raise_if_failed(final)
                if final is not None:
                    finals[index] = final
                    ctx.completion_tokens += len(final.token_ids)
                    ctx.finished(index, final)
        assert all(final is not None for final in finals)
        return self.response(ctx, finals)  # type: ignore[arg-type]


def check_model(requested: str | None, served: str) -> None:
    """A 404 in OpenAI's shape for a model this server does not serve."""
    if requested is not None and requested != served:
        raise APIError(
            404,
            f"The model `{requested}` does not exist (this server serves `{served}`)",
            param="model",
            code="model_not_found",
        )


class LastPiece(str):
    """A stream's last piece of text, which ends its response's body (``_EventStream``)."""


class _EventStream(StreamingResponse):
    """An SSE response that runs ``on_close`` however it ends: when the client goes away
    while the body generator waits at a ``yield``, the generator is not resumed and its
    ``finally`` would only run when it is garbage collected.

    It streams until the body ends or the client goes away, as Starlette's own does, but
    in two plain asyncio tasks: Starlette's anyio task group and cancel scope cost a burst's
    event loop ~50 us more per request."""

    def __init__(self, body: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._on_close = on_close

    async def stream_response(self, send: Send) -> None:
        """Starlette's, but a ``LastPiece`` ends the body itself: uvicorn writes it and the
        end of the chunked body to the socket at once, instead of one after the other."""
        start = {"type": "http.response.start", "status": self.status_code,
                 "headers": self.raw_headers}  # fmt: skip
        await send(start)
        ended = False
        async for piece in self.body_iterator:
            assert isinstance(piece, str) and not ended, "text, nothing after the last piece"
            ended = isinstance(piece, LastPiece)
            await send(
                {"type": "http.response.body", "body": piece.encode(), "more_body": not ended}
            )
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = asyncio.ensure_future(self.stream_response(send))
        disconnect = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait((stream, disconnect), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stream.cancel()
            disconnect.cancel()
            self._on_close()
        if stream.done() and not stream.cancelled():
            stream.result()  # the body's error, if it failed


class _SequenceFailed(RuntimeError):
    """The engine finished a sequence with an error (e.g. it cannot fit in the cache)."""


def _raise_if_failed(out: RequestOutput | None) -> None:
    if out is not None and out.finish_reason == "error":
        raise _SequenceFailed(out.error or "generation failed")


def _as_api_error(exc: Exception) -> APIError:
    if isinstance(exc, RequestTimeoutError):
        return APIError(504, str(exc), "server_error", code="timeout")
    if isinstance(exc, EngineStoppedError):
        return unavailable(exc)
    logger.error("a sequence failed: %s", exc)
    if str(exc).startswith(f"{GRAMMAR_FIELD}: "):  # its own grammar failed: it may be changed
        return APIError.bad_request(exc)
    return internal_server_error()


def unavailable(exc: EngineStoppedError) -> APIError:
    """A 503 for a server that is not serving; why the engine failed stays in the log."""
    message = str(exc)
    if message.startswith(ENGINE_FAILED):
        message = f"{ENGINE_FAILED} (the server logged why)"
    return APIError(503, message, "server_error", code="unavailable")


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass
