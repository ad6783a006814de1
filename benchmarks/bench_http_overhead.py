"""Serving overhead: one workload through ``infer serve`` over HTTP and through the same
engine in-process (the offline path), with the same engine flags; reports both output-token
throughputs and their ratio (goal on a GPU: HTTP >= 90 % of offline).

It uses the benchmark harness (``infer.bench``): the workloads (random token-id prompts,
greedy, EOS ignored, so both sides generate exactly the same tokens), the HTTP client
(streamed SSE, client-side timing, ``return_token_ids`` for exact token times) and the
in-process runner. The server runs in a child process, this process is the client.

    # CPU, SmolLM2 (small, so it finishes in minutes):
    python benchmarks/bench_http_overhead.py --device cpu --num-gpu-blocks 2048 \\
        --max-seq-len 1024 --num-requests 32 --max-tokens 32
    # GPU:
    python benchmarks/bench_http_overhead.py --model llama-3.2-3b --load-format dummy

Every flag this script does not know is an engine flag (``infer serve``'s), given to both.
Writes ``benchmarks/results/http-overhead-<model>-<workload>-<date>.{json,png}``.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch

from infer.bench.http_client import run_serving
from infer.bench.metrics import RunResult, summarize
from infer.bench.offline import run_infer
from infer.bench.results import environment, results_dir, write_json
from infer.bench.scoreboard import summary_values, update_many
from infer.cli.engine_args import add_engine_args, engine_config_from_args
from infer.config import ModelConfig
from infer.engine.core.engine import Engine
from infer.loader import resolve_model
from infer.server.bridge.launch import spawn_server
from infer.workloads import WORKLOADS, Workload, make_workload

WARMUP_MAX_TOKENS = 16


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="burst256", choices=sorted(WORKLOADS))
    parser.add_argument("--num-requests", type=int, help="scale the workload")
    parser.add_argument("--max-tokens", type=int, help="cap each request's output")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured warm-up requests")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=4,
        help="HTTP client processes (one Python process parses too few SSE events a second "
        "to keep up with a fast server; default: 4)",
    )
    parser.add_argument("--output", type=Path, help="result JSON (a PNG is written beside it)")
    return parser


def _workloads(args: argparse.Namespace, vocab_size: int) -> tuple[Workload, Workload]:
    workload = make_workload(args.workload, vocab_size, args.num_requests, args.seed)
    if args.max_tokens is not None:
        workload = workload.capped(args.max_tokens)
    warmup = make_workload(args.workload, vocab_size, max(1, args.warmup), args.seed + 1)
    return workload, warmup.capped(WARMUP_MAX_TOKENS)


def run_http(
    engine_argv: list[str], workload: Workload, warmup: Workload, client_processes: int
) -> RunResult:
    with spawn_server(engine_argv) as server:
        _, result = asyncio.run(
            run_serving(server.url, workload, warmup=warmup, processes=client_processes)
        )
    return result


def _plot(record: dict[str, Any], path: Path) -> None:
    offline, http = record["offline"], record["http"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    bars = left.bar(["offline", "HTTP"], [offline["output_tok_s"], http["output_tok_s"]],
                    color=["#4c72b0", "#dd8452"])  # fmt: skip
    left.bar_label(bars, fmt="%.0f")
    left.set_ylabel("output tokens / s")
    left.set_title(f"HTTP = {record['http_vs_offline']:.0%} of offline")
    for name, summary in (("offline", offline), ("HTTP", http)):
        cdf = summary["cdf"]["itl_ms"]
        right.plot(cdf, [i / (len(cdf) - 1) for i in range(len(cdf))], label=name)
    right.set_xscale("symlog", linthresh=1.0)
    right.set_xlabel("inter-token latency (ms)")
    right.set_ylabel("fraction of tokens")
    right.legend()
    fig.suptitle(f"{record['model']}, {record['workload']} on {record['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _record_scores(args: argparse.Namespace, model: str, record: dict[str, Any]) -> None:
    """Headline figures (``infer.bench.scoreboard``): GPU runs of the workload as defined."""
    if not torch.cuda.is_available() or args.num_requests or args.max_tokens or args.seed:
        return
    prefix = f"http_overhead/{Path(model).name}/{record['workload']}"
    values = {
        **summary_values(f"{prefix}/http", record["http"]),
        **summary_values(f"{prefix}/offline", record["offline"]),
        f"{prefix}/http_vs_offline": (record["http_vs_offline"] * 100, "%"),
    }
    update_many(values, sampling="greedy")
    print(f"scoreboard: {len(values)} figures under {prefix}/")


def main() -> None:
    args, engine_argv = _parser().parse_known_args()
    engine_parser = argparse.ArgumentParser(prog="engine flags")
    add_engine_args(engine_parser)
    config = engine_config_from_args(engine_parser.parse_args(engine_argv))
    vocab_size = ModelConfig.from_hf_dict(resolve_model(config.model).hf_config).vocab_size
    workload, warmup = _workloads(args, vocab_size)

    http = summarize(
        run_http(engine_argv, workload, warmup, args.client_processes)
    )  # the server process exits first
    offline = summarize(run_infer(Engine(config), workload, warmup))
    for side, summary in (("HTTP", http), ("offline", offline)):
        if summary["num_failed"]:
            failed, errors = summary["num_failed"], summary["errors"]
            raise SystemExit(f"{side}: {failed} requests failed: {errors}")
    record = {
        "benchmark": "http_overhead",
        "model": config.model,
        "workload": workload.name,
        "description": workload.description,
        "num_requests": len(workload.requests),
        "max_tokens_cap": args.max_tokens,
        "engine_flags": engine_argv,
        "http_vs_offline": round(http["output_tok_s"] / offline["output_tok_s"], 4),
        "offline": offline,
        "http": http,
        **environment(),
    }
    stem = f"http-overhead-{Path(config.model).stem}-{workload.name}-{record['date']}"
    output = args.output or results_dir() / f"{stem.replace(':', '')}.json"
    write_json(record, output)
    _plot(record, output.with_suffix(".png"))
    _record_scores(args, config.model, record)
    print(
        f"{workload.name} x{len(workload.requests)}: offline {offline['output_tok_s']:.1f} tok/s, "
        f"HTTP {http['output_tok_s']:.1f} tok/s = {record['http_vs_offline']:.1%} of offline "
        f"(TTFT p50 {offline['ttft_ms']['p50']} / {http['ttft_ms']['p50']} ms, ITL p50 "
        f"{offline['itl_ms']['p50']} / {http['itl_ms']['p50']} ms); wrote {output}"
    )


if __name__ == "__main__":
    main()
