"""The FastAPI app: ``create_app(config, ...)`` wires the OpenAI endpoints, health,
Prometheus metrics and cache statistics around an ``EngineClient``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from infer import __version__
from infer.config import EngineConfig
from infer.contract.pipes import EngineLink
from infer.heap import IdleCollections, freeze_heap
from infer.server.bridge.api_workers import ApiWorkers
from infer.server.bridge.engine_client import EngineClient, EngineStoppedError
from infer.server.bridge.replica_totals import replicas_cache_stats
from infer.server.guards.allowed_hosts import ANY_HOST, AllowedHosts
from infer.server.guards.auth import APIKeyMiddleware
from infer.server.guards.body_limit import BodyLimit
from infer.server.guards.concurrency import ConcurrencyLimit
from infer.server.guards.in_flight import InFlight
from infer.server.guards.json_body import JSONBodyRoute
from infer.server.guards.request_limits import (
    DEFAULT_GRAMMAR_TIMEOUT_S,
    DEFAULT_GRAMMAR_WORKERS,
    DEFAULT_LIMITS,
    LimitsApplied,
    RequestLimits,
)
from infer.server.guards.retry_after import RetryAfterEstimator
from infer.server.http.chat import DEFAULT_CHAT_OPTIONS, ChatOptions, ChatServing
from infer.server.http.completions import CompletionServing
from infer.server.http.dashboard import install_dashboard
from infer.server.http.docs import install_docs
from infer.server.http.errors import APIError, install_error_handlers
from infer.server.http.grammar_check import GrammarChecker
from infer.server.http.metrics import ServerMetrics
from infer.server.http.openapi import (
    AUTHENTICATED,
    BAD_REQUEST,
    NOT_FOUND,
    UNAVAILABLE,
    generation_responses,
    install_openapi,
    json_body_schema,
)
from infer.server.http.responses import ResponseObject, ResponsesRequest, ResponsesServing
from infer.server.http.serving import Guards, check_model, unavailable
from infer.server.http.tokenize import TokenizeServing
from infer.server.openai.logprobs import LogprobFormatter
from infer.server.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
)

if TYPE_CHECKING:
    from infer.engine.process import EngineFactory

# Never refused for capacity (``guards/concurrency.py``).
PROBES = frozenset({"/health", "/ping", "/metrics"})


def create_app(
    config: EngineConfig,
    served_model_name: str | None = None,
    api_key: str | None = None,
    request_timeout: float | None = None,
    engine_factory: EngineFactory | None = None,
    links: Sequence[EngineLink] | None = None,
    in_flight: InFlight | None = None,
    workers: ApiWorkers | None = None,
    chat: ChatOptions = DEFAULT_CHAT_OPTIONS,
    limits: RequestLimits = DEFAULT_LIMITS,
    grammar_workers: int = DEFAULT_GRAMMAR_WORKERS,
    grammar_timeout: float = DEFAULT_GRAMMAR_TIMEOUT_S,
    limit_concurrency: int | None = None,
    requests: InFlight | None = None,
    allowed_hosts: Sequence[str] = (ANY_HOST,),
) -> FastAPI:
    """An app serving ``config``'s model. Its lifespan starts the engine process (startup
    completes once the model is loaded) and stops it. ``chat``: how conversations are
    rendered and answers read (a reasoning parser); ``limits`` bound each request's inputs,
    and its constraint is checked by ``grammar_workers`` processes, each check cut off
    after ``grammar_timeout`` seconds (``grammar_check.py``). At most ``limit_concurrency``
    requests (counted in ``requests``, shared by the API processes) are served at once
    (``guards/concurrency.py``); None: no bound. ``allowed_hosts``: the ``Host`` names answered
    (``guards/allowed_hosts.py``).

    What a request must pass is decided from its headers, before its body is read, in this
    order: its ``Host``, its key, its body's announced size; the body is then read within
    ``limits.max_body_bytes``, and only a whole request takes a place in the concurrency.

    ``app.state.engine`` is the ``EngineClient`` (the launcher drains it on shutdown);
    ``engine_factory`` builds the engine in its process (a stand-in measures the API alone;
    None: the model's engine).
    ``links`` (to each data-parallel replica's engine) and ``in_flight`` are the
    ``EngineClient``'s (several API processes, see ``bridge/api_workers.py``); ``workers``,
    started and stopped by the lifespan around the engine, are the API workers of the process
    that starts the engine.
    """
    engine = EngineClient(config, request_timeout, engine_factory, links, in_flight)
    model_name = served_model_name or config.model
    metrics = ServerMetrics(lambda: engine.snapshot, engine.replica_reports)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if workers is not None:
            workers.start()  # they start up while the model loads
        try:
            await engine.start()
        except BaseException:
            if workers is not None:
                await workers.stop()
            raise
        logprobs = LogprobFormatter(engine.prompts.tokenizer)
        retry_after = RetryAfterEstimator()
        info = engine.info
        grammars = GrammarChecker(info.tokenizer_path, info.eos_token_ids, info.vocab_size,
                                  grammar_workers, grammar_timeout)  # fmt: skip
        guards = Guards(limits, grammars)
        serving = (engine, model_name, metrics, logprobs, retry_after, guards)
        app.state.completions = CompletionServing(*serving)
        app.state.chat = ChatServing(*serving, chat)
        app.state.tokenize = TokenizeServing(app.state.chat)
        app.state.responses = ResponsesServing(*serving, chat)
        # Full collections over the start-up heap stall a busy event loop; with it frozen,
        # those that remain wait for an idle moment (benchmarks/results-by-topic/
        # 02-serving.md, 2.12; 05-step-loop.md, 5.1).
        freeze_heap()
        with IdleCollections() as collections:
            engine.collections = collections
            try:
                if workers is not None:
                    await workers.wait_ready()
                yield
            finally:
                if workers is not None:
                    await workers.stop()  # their requests end before the engine does
                await engine.stop()
                await asyncio.to_thread(grammars.close)

    app = FastAPI(title="infer", version=__version__, lifespan=lifespan, docs_url=None,
                  redoc_url=None)  # fmt: skip
    app.router.route_class = JSONBodyRoute  # large bodies parsed off the event loop
    app.state.engine = engine
    install_error_handlers(app)
    install_openapi(app)
    install_docs(app)
    # Each middleware added wraps those added before it: the first added runs last.
    if limit_concurrency is not None:
        app.add_middleware(ConcurrencyLimit, limit=limit_concurrency,
                           requests=requests or InFlight(), exempt=PROBES)  # fmt: skip
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if ANY_HOST not in allowed_hosts:
        app.add_middleware(AllowedHosts, allowed=allowed_hosts)
    app.add_middleware(LimitsApplied, limits=limits)

    @app.post(
        "/v1/completions",
        response_model=None,
        responses=generation_responses(CompletionResponse, CompletionResponse),
    )
    async def create_completion(body: CompletionRequest, raw: Request) -> Response:
        serving: CompletionServing = raw.app.state.completions
        return await serving.create(body, raw)

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses=generation_responses(ChatCompletionResponse, ChatCompletionChunk),
    )
    async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
        serving: ChatServing = raw.app.state.chat
        return await serving.create(body, raw)

    @app.post(
        "/v1/responses",
        response_model=None,
        responses=generation_responses(ResponseObject, ResponseObject),
    )
    async def create_response(body: ResponsesRequest, raw: Request) -> Response:
        """OpenAI's Responses API, for text (stateless: ``store`` false)."""
        serving: ResponsesServing = raw.app.state.responses
        return await serving.create_response(body, raw)

    @app.get("/v1/models", responses=AUTHENTICATED)
    async def list_models() -> ModelList:
        card = ModelCard(id=model_name, created=created, max_model_len=engine.info.max_seq_len)
        return ModelList(data=[card])

    @app.get("/v1/models/{model_id:path}", responses={**AUTHENTICATED, **NOT_FOUND})
    async def retrieve_model(model_id: str) -> ModelCard:
        check_model(model_id, model_name)
        return ModelCard(id=model_name, created=created, max_model_len=engine.info.max_seq_len)

    @app.post(
        "/tokenize",
        response_model=TokenizeResponse,
        responses={**AUTHENTICATED, **BAD_REQUEST, **NOT_FOUND},
    )
    async def tokenize(body: dict[str, Any], raw: Request) -> Response:
        """vLLM's: ``prompt`` or ``messages`` (with the chat fields) to token ids."""
        serving: TokenizeServing = raw.app.state.tokenize
        return await serving.tokenize(body)

    @app.post(
        "/detokenize",
        response_model=DetokenizeResponse,
        responses={**AUTHENTICATED, **BAD_REQUEST, **NOT_FOUND},
        openapi_extra=json_body_schema(DetokenizeRequest),
    )
    async def detokenize(body: dict[str, Any], raw: Request) -> Response:
        """vLLM's: token ids to text (at most ``max_seq_len`` of them)."""
        serving: TokenizeServing = raw.app.state.tokenize
        return await serving.detokenize(body)

    @app.get("/v1/cache/stats", responses={**AUTHENTICATED, **UNAVAILABLE})
    async def cache_stats() -> JSONResponse:
        """The KV pool's memory metrics (seed 004), read in the engine between steps; with
        several replicas, their total and each one's (``replicas``)."""
        try:
            if engine.num_replicas == 1:
                return JSONResponse(await engine.call("cache_stats"))
            each = await engine.call_each("cache_stats")
        except EngineStoppedError as exc:
            raise unavailable(exc) from exc
        return JSONResponse(replicas_cache_stats(engine.replica_reports(), each))

    install_dashboard(app, engine, model_name)

    async def health() -> JSONResponse:
        if engine.error is not None:  # why is in the log
            raise APIError(503, "the engine failed", "server_error")
        if not engine.is_healthy or not engine.accepting:
            raise APIError(503, "the server is not serving (starting or shutting down)",
                           "server_error")  # fmt: skip
        if engine.num_replicas == 1:
            return JSONResponse({"status": "ok"})
        replicas = [report.status() for report in engine.replica_reports()]
        return JSONResponse({"status": "ok", "replicas": replicas})

    # ``/ping`` is vLLM's name (SageMaker's probe, which POSTs); load balancers probe with
    # HEAD too (Starlette answers it with the headers alone). One route per method: each
    # has its own operation in the OpenAPI document, HEAD none.
    for path, methods in (("/health", ("GET", "HEAD")), ("/ping", ("GET", "POST", "HEAD"))):
        for method in methods:
            app.add_api_route(
                path,
                health,
                methods=[method],
                responses=UNAVAILABLE,
                include_in_schema=method != "HEAD",
            )

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
