"""Where a served burst's time goes under vLLM's own client (diagnosis, GPU with vLLM).

Times are ``time.perf_counter`` (one clock for every process of the machine), from the start
of the client's first timed request. vLLM's ``bench serve`` saves each request's start; the
servers record the rest:

    python benchmarks/served_burst_timeline.py --out /tmp/timeline            # infer serve
    python benchmarks/served_burst_timeline.py --out /tmp/timeline --null     # the client alone

- ``infer``: ``infer serve`` with its API intake and engine steps traced
  (``trace_serving.serve``), each workload's burst sent by ``vllm bench serve`` with a seed of
  its own (a repeated seed would send prompts the prefix cache already holds). Per run: when
  requests started at the client, were reserved by the API process (parsed, validated),
  submitted (tokenized) and taken in by the engine; the prefill steps; the engine's last step
  against the client's last token.
- ``--null``: a server that answers every request at once with one token, recording when each
  connection and request arrived: how fast the client alone puts a burst on the wire.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from infer.bench.vllm_bench import SERVING_WORKLOADS, client_command
from infer.bench.vllm_peer import VLLM_ENVIRONMENT
from serve_overhead_cpu import _free_port, _wait_healthy
from trace_serving import SERVED

CHECKPOINT = ".cache/ckpt-llama-3.2-3b"
QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)
_ONE_TOKEN = (
    b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"a",'
    b'"finish_reason":"length"}]}\n\n'
    b'data: {"id":"x","object":"text_completion","choices":[],"usage":{"prompt_tokens":1,'
    b'"completion_tokens":1,"total_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


def serve_null(port: int, arrivals: Path) -> None:
    """Answer each request with one token at once; one JSON line per request: when its
    connection was made, and when its headers and body had arrived."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    response = head % len(_ONE_TOKEN) + _ONE_TOKEN
    log = arrivals.open("a")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected = time.perf_counter()
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                at_headers = time.perf_counter()
                length = next(
                    (int(line.split(b":")[1]) for line in headers.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")),
                    0,
                )  # fmt: skip
                await reader.readexactly(length)
                times = {"connected": connected, "headers": at_headers}
                log.write(json.dumps({**times, "body": time.perf_counter()}) + "\n")
                log.flush()
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def run() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


def quantiles_ms(times: list[float], origin: float) -> list[float]:
    """``times`` at ``QUANTILES``, in ms after ``origin``."""
    if not times:
        return []
    ordered = sorted(times)
    return [round(1000 * (ordered[int(q * (len(ordered) - 1))] - origin), 1) for q in QUANTILES]


def _lines(path: Path, start: int, end: int | None = None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = path.read_bytes()[start:end]
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _run_client(
    out: Path, run: str, workload: str, port: int, seed: int, env: dict[str, str]
) -> dict[str, Any]:
    """One ``vllm bench serve`` run; its saved result, without the generated texts."""
    result = out / f"client-{run}.json"
    command = client_command(
        sys.executable, SERVING_WORKLOADS[workload], f"http://127.0.0.1:{port}", CHECKPOINT,
        SERVED, result, 2, seed, "greedy",
    )  # fmt: skip
    with (out / f"client-{run}.log").open("w") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    saved: dict[str, Any] = json.loads(result.read_text())
    saved.pop("generated_texts", None)
    result.write_text(json.dumps(saved))
    return saved


def _client_times(saved: dict[str, Any]) -> tuple[list[float], list[float], list[float]]:
    """Each request's start, first token and last token (perf_counter)."""
    starts = saved["start_times"]
    firsts = [s + t for s, t in zip(starts, saved["ttfts"], strict=True)]
    lasts = [f + sum(i) for f, i in zip(firsts, saved["itls"], strict=True)]
    return starts, firsts, lasts


def null_runs(
    out: Path, seeds: list[int], workloads: list[str], env: dict[str, str]
) -> list[dict[str, Any]]:
    port = _free_port()
    arrivals = out / "arrivals.jsonl"
    server = subprocess.Popen([sys.executable, __file__, "--out", str(out), "--serve-null",
                               str(port)])  # fmt: skip
    reports = []
    try:
        time.sleep(2.0)
        for seed, workload in zip(seeds, workloads, strict=True):
            mark = _size(arrivals)
            saved = _run_client(out, f"null-{seed}", workload, port, seed, env)
            starts, _, lasts = _client_times(saved)
            origin = min(starts)
            seen = [a for a in _lines(arrivals, mark) if a["connected"] >= origin - 1e-3]
            reports.append({
                "run": f"null-{seed}",
                "client_start_ms": quantiles_ms(starts, origin),
                "connected_ms": quantiles_ms([a["connected"] for a in seen], origin),
                "request_arrived_ms": quantiles_ms([a["body"] for a in seen], origin),
                "last_response_ms": round(1000 * (max(lasts) - origin), 1),
            })  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)
    return reports


def infer_runs(
    out: Path, seeds: list[int], workloads: list[str], env: dict[str, str]
) -> list[dict[str, Any]]:
    port = _free_port()
    command = [sys.executable, "benchmarks/trace_serving.py", "--model", CHECKPOINT,
               "--out", str(out), "--serve", str(port)]  # fmt: skip
    server = subprocess.Popen(command, stdout=(out / "serve.log").open("w"),
                              stderr=subprocess.STDOUT)  # fmt: skip
    reports = []
    try:
        _wait_healthy(port, server)
        for seed, workload in zip(seeds, workloads, strict=True):
            marks = (_size(out / "api.jsonl"), _size(out / "engine.jsonl"))
            saved = _run_client(out, f"infer-{workload}-{seed}", workload, port, seed, env)
            time.sleep(1.0)  # the trace files flushed
            reports.append(_infer_report(out, saved, workload, seed, marks))
    finally:
        server.terminate()
        server.wait(90)
    return reports


def _infer_report(
    out: Path, saved: dict[str, Any], workload: str, seed: int, marks: tuple[int, int]
) -> dict[str, Any]:
    starts, firsts, lasts = _client_times(saved)
    origin = min(starts)
    api = [e for e in _lines(out / "api.jsonl", marks[0]) if e["t"] >= origin]
    steps = [e for e in _lines(out / "engine.jsonl", marks[1]) if e["t0"] >= origin]
    forwards = [e for e in steps if e["ev"] == "launch"]
    collects = [e for e in steps if e["ev"] == "collect"]

    def ms(t: float) -> float:
        return round(1000 * (t - origin), 1)

    prefill = [
        (ms(f["t0"]), f["prompt_tokens"], ms(c["t1"]))
        for f, c in zip(forwards, collects, strict=False)
        if f.get("prompt_tokens", 0) > 64
    ]

    def when(event: str) -> list[float]:
        return quantiles_ms([e["t"] for e in api if e["ev"] == event], origin)

    return {
        "run": f"{workload}-{seed}",
        "output_tok_s": round(saved["output_throughput"], 1),
        "duration_s": round(saved["duration"], 3),
        "client_start_ms": quantiles_ms(starts, origin),
        "reserved_ms": when("reserve"),
        "submitted_ms": when("submit"),
        "engine_took_ms": quantiles_ms(
            [e["t0"] for e in steps if e["ev"] == "add_request"], origin
        ),
        "client_first_token_ms": quantiles_ms(firsts, origin),
        "prefill_steps_launch_tokens_collected_ms": prefill,
        "engine_last_step_ms": ms(collects[-1]["t1"]),
        "client_last_token_ms": ms(max(lasts)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--null", action="store_true", help="the client against a null server")
    parser.add_argument("--seeds", default="1,2,3", help="one run per seed")
    parser.add_argument(
        "--workloads",
        default="burst256,completions,burst256",
        help="each run's workload (vllm_bench's names), one per seed; --null uses the first",
    )
    parser.add_argument("--vllm-site", default="/tmp/vsite")
    parser.add_argument("--serve-null", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.serve_null is not None:
        serve_null(args.serve_null, args.out / "arrivals.jsonl")
        return
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **VLLM_ENVIRONMENT}
    env["PYTHONPATH"] = ":".join(p for p in (args.vllm_site, env.get("PYTHONPATH")) if p)
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = args.workloads.split(",")
    if args.null:
        workloads = workloads[:1] * len(seeds)
    if len(workloads) != len(seeds) or not set(workloads) <= set(SERVING_WORKLOADS):
        raise SystemExit(f"--workloads: one of {', '.join(SERVING_WORKLOADS)} per seed")
    runs = null_runs if args.null else infer_runs
    reports = runs(args.out, seeds, workloads, env)
    (args.out / f"timeline-{'null' if args.null else 'infer'}.json").write_text(
        json.dumps(reports, indent=1)
    )
    for report in reports:
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
