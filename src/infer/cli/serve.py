"""``infer serve``: the OpenAI-compatible HTTP server (every engine flag, plus HTTP ones)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import sys
import tempfile

from infer.cli.engine_args import add_engine_args, engine_config_from_args
from infer.distributed.layout import node_ranks
from infer.server.guards.request_head import (
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    HeadLimits,
)
from infer.server.guards.request_limits import (
    DEFAULT_GRAMMAR_TIMEOUT_S,
    DEFAULT_GRAMMAR_WORKERS,
    DEFAULT_LIMITS,
    RequestLimits,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the OpenAI API (/v1/completions, /v1/chat/completions, ...)",
        description="Serve a model over the OpenAI API, with /health, /metrics and "
        "/v1/cache/stats.",
    )
    http = parser.add_argument_group("server options")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    http.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    http.add_argument(
        "--api-key",
        default=os.environ.get("INFER_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route but /health, /ping, "
        "/version and /metrics (default: $INFER_API_KEY)",
    )
    http.add_argument(
        "--allowed-hosts",
        default=None,
        metavar="HOST[,HOST...]",
        help="the names a request's Host header may give (e.g. 'api.example.com,*.internal'; "
        "'*' any), against DNS rebinding (default: loopback names when --host is a loopback "
        "address, else any)",
    )
    http.add_argument(
        "--served-model-name", help="model name clients pass and see (default: --model)"
    )
    http.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="abort requests running longer than this many seconds (default: none)",
    )
    http.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="on SIGINT/SIGTERM, seconds until the process has exited: in-flight requests "
        "get all but the last second of them (half, under 2 s) to finish, then are aborted "
        "(default: 10)",
    )
    http.add_argument(
        "--timeout-keep-alive",
        type=int,
        default=30,
        help="seconds an idle keep-alive connection stays open (default: 30; longer than "
        "clients keep theirs, so they never reuse one the server is closing)",
    )
    http.add_argument(
        "--limit-concurrency",
        type=int,
        default=None,
        help="most requests in the server at once, being served or queued (counted once "
        "they have arrived whole; /health and /metrics aside); one beyond them gets a 503 "
        "(default: max_batch_size + max_waiting_requests per replica, + 256)",
    )
    http.add_argument(
        "--header-timeout",
        type=float,
        default=5.0,
        help="seconds a connection gets to send a request's headers, from its first byte "
        "(or from opening, for its first request); slower ones are closed (default: 5)",
    )
    http.add_argument(
        "--max-header-bytes",
        type=int,
        default=DEFAULT_MAX_HEADER_BYTES,
        help="most bytes of a request's line and headers; beyond, 431 "
        f"(default: {DEFAULT_MAX_HEADER_BYTES})",
    )
    http.add_argument(
        "--max-headers",
        type=int,
        default=DEFAULT_MAX_HEADERS,
        help=f"most headers in a request; beyond, 431 (default: {DEFAULT_MAX_HEADERS})",
    )
    http.add_argument(
        "--request-read-timeout",
        type=float,
        default=30.0,
        help="seconds a connection gets to send a whole request (headers and body), from "
        "the same moment; slower ones are closed (default: 30)",
    )
    http.add_argument(
        "--limit-pending-connections",
        type=int,
        default=1024,
        help="most connections that have not sent a whole request (just opened, partway "
        "through one, or idle between two); beyond them the one idle longest is closed, "
        "else the one incomplete longest (default: 1024)",
    )
    http.add_argument(
        "--limit-pending-per-client",
        type=int,
        default=256,
        help="the same bound for the connections of one client address (default: 256)",
    )
    http.add_argument(
        "--api-server-count",
        type=int,
        default=1,
        help="API processes sharing the HTTP work of the engine: parsing, tokenizing, "
        "streaming (default: 1; on a 16-core H100 host more did not serve a 256-request "
        "burst faster, see benchmarks/results-by-topic/02-serving.md, 2.2)",
    )
    http.add_argument(
        "--data-parallel-size",
        "-dp",
        type=int,
        default=1,
        help="engine replicas on this host, each on its own GPUs (tensor_parallel_size of "
        "them; on the CPU, its share of the cores), behind the same port; each request goes "
        "to the one caching the longest prefix of its prompt, unless that one is loaded well "
        "beyond the others (default: 1)",
    )
    http.add_argument("--log-level", default="info", help="uvicorn log level (default: info)")
    limits = parser.add_argument_group("request limits (each a 400 naming the field)")
    for name, value in vars(DEFAULT_LIMITS).items():
        limits.add_argument(
            "--" + name.replace("_", "-"), type=int, default=value, help=f"(default: {value})"
        )
    limits.add_argument(
        "--grammar-workers",
        type=int,
        default=DEFAULT_GRAMMAR_WORKERS,
        help="processes (per API process) that check structured-output grammars, so that none "
        f"can crash or stall the server (default: {DEFAULT_GRAMMAR_WORKERS})",
    )
    limits.add_argument(
        "--grammar-timeout",
        type=float,
        default=DEFAULT_GRAMMAR_TIMEOUT_S,
        help="seconds a grammar may take to compile; longer is a 400 "
        f"(default: {DEFAULT_GRAMMAR_TIMEOUT_S:g})",
    )
    chat = parser.add_argument_group("chat options")
    chat.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="{deepseek_r1,qwen3}",
        help="return a thinking model's <think>...</think> as reasoning_content, apart from "
        "the answer in content; structured outputs and tool calls apply to the answer "
        "(qwen3: thinking unless chat_template_kwargs enable_thinking is false; "
        "deepseek_r1: always; default: none, the thoughts stay in content)",
    )
    chat.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render chat templates that requests send (chat_template); a template is code "
        "the server runs, so they are refused unless this is given",
    )
    add_engine_args(parser)
    parser.set_defaults(handler=run)


def _hosts(flag: str | None) -> list[str] | None:
    """``--allowed-hosts``: names separated by commas (None: the default)."""
    if flag is None:
        return None
    hosts = [name.strip() for name in flag.split(",") if name.strip()]
    if not hosts:
        raise ValueError("allowed_hosts: give at least one name (or '*' for any)")
    return hosts


def run(args: argparse.Namespace) -> int:
    if args.api_server_count == 1:
        code = _serve(args)
    else:
        with tempfile.TemporaryDirectory(prefix="infer-metrics-") as metrics_dir:
            # Before prometheus_client is imported (with the server): every API process then
            # keeps its metrics there (see infer.server.http.metrics).
            os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", metrics_dir)
            code = _serve(args)
    # The server has shut down (its engine and workers have exited); tearing the
    # interpreter down, torch and all, would only make a supervisor wait
    # (benchmarks/results-by-topic/09-reliability.md, 9.4).
    _exit_now(code)
    return code  # not reached


def _exit_now(code: int) -> None:
    """End the process with ``code``: its exit handlers run (multiprocessing's release its
    semaphores) and its logs are flushed, but the interpreter is not torn down."""
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _serve(args: argparse.Namespace) -> int:
    from infer.server.bridge.launch import build_server
    from infer.server.http.chat import ChatOptions
    from infer.server.openai.reasoning import reasoning_parser

    config = engine_config_from_args(args)
    if not node_ranks(config).runs_engine:  # another node's ranks: no API here
        from infer.engine.setup.tp_node import serve_node

        return serve_node(config)
    server = build_server(
        config,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        request_timeout=args.request_timeout,
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.log_level,
        timeout_keep_alive=args.timeout_keep_alive,
        limit_concurrency=args.limit_concurrency,
        header_timeout=args.header_timeout,
        request_read_timeout=args.request_read_timeout,
        limit_pending_connections=args.limit_pending_connections,
        limit_pending_per_client=args.limit_pending_per_client,
        api_server_count=args.api_server_count,
        data_parallel_size=args.data_parallel_size,
        chat=ChatOptions(reasoning_parser(args.reasoning_parser), args.trust_request_chat_template),
        limits=RequestLimits(**{name: getattr(args, name) for name in vars(DEFAULT_LIMITS)}),
        grammar_workers=args.grammar_workers,
        grammar_timeout=args.grammar_timeout,
        head=HeadLimits(args.max_header_bytes, args.max_headers),
        allowed_hosts=_hosts(args.allowed_hosts),
    )
    with contextlib.suppress(KeyboardInterrupt):  # how ``run`` ends after SIGINT or SIGTERM
        server.run()
    return server.exit_code
