"""``infer router``: the OpenAI API in front of several ``infer serve`` workers, each request
sent where its prompt's prefix is cached, balanced against load."""

from __future__ import annotations

import argparse
import logging
import os

from infer.routing import DEFAULT_ROUTING


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "router",
        help="route the OpenAI API to several `infer serve` workers (prefix cache and load)",
        description="Serve the OpenAI API (/v1/completions, /v1/chat/completions, "
        "/v1/responses, /v1/models) by forwarding each request to one of the workers: the one "
        "that caches the longest prefix of its prompt (by the prompt's text), unless it is "
        "overloaded next to the others. Also /health, /metrics, and /workers (GET to list, "
        'POST {"url": URL} to add, DELETE ?url=URL to remove, while it runs).',
    )
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="URL",
        help="an `infer serve` base URL, e.g. http://10.0.0.2:8000 (repeat for each; more "
        "can be added later through POST /workers)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("INFER_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/ routes and /workers; the header "
        "goes on to the workers, so workers with a key need the same one "
        "(default: $INFER_API_KEY)",
    )
    parser.add_argument(
        "--health-interval",
        type=float,
        default=2.0,
        help="seconds between health probes of each worker (GET /health); a worker that fails "
        "one leaves rotation until it passes one (default: 2)",
    )
    parser.add_argument(
        "--health-timeout",
        type=float,
        default=5.0,
        help="seconds a worker gets to answer a probe (default: 5)",
    )
    policy = parser.add_argument_group("routing policy")
    policy.add_argument(
        "--cache-threshold",
        type=float,
        default=DEFAULT_ROUTING.cache_threshold,
        help="share of the prompt a worker must hold cached for the request to go there "
        f"rather than to the least loaded worker (default: {DEFAULT_ROUTING.cache_threshold})",
    )
    policy.add_argument(
        "--balance-abs-threshold",
        type=int,
        default=DEFAULT_ROUTING.balance_abs_threshold,
        help="a worker with more requests in flight than the least loaded one by more than "
        "this, and by the relative threshold, gets no requests for its cache "
        f"(default: {DEFAULT_ROUTING.balance_abs_threshold})",
    )
    policy.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=DEFAULT_ROUTING.balance_rel_threshold,
        help="... and more than this many times the least loaded one's "
        f"(default: {DEFAULT_ROUTING.balance_rel_threshold})",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="on SIGINT/SIGTERM, seconds open requests get to finish (default: 10)",
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level (default: info)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from infer.router.app import create_router_app
    from infer.routing import RoutingSettings

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per forwarded request
    if not 0 <= args.port < 65536:
        raise ValueError(f"port: must be in [0, 65535], got {args.port}")
    if args.shutdown_timeout < 0:
        raise ValueError(f"shutdown_timeout: must be >= 0 seconds, got {args.shutdown_timeout}")
    settings = RoutingSettings(
        cache_threshold=args.cache_threshold,
        balance_abs_threshold=args.balance_abs_threshold,
        balance_rel_threshold=args.balance_rel_threshold,
    )
    app = create_router_app(
        args.worker,
        api_key=args.api_key,
        settings=settings,
        health_interval=args.health_interval,
        health_timeout=args.health_timeout,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=int(args.shutdown_timeout) or None,
    )
    return 0
