"""What the API process costs, on a CPU: ``infer serve``'s real API process and engine
process loop, with a stand-in engine (``infer.engine.standin``: a fixed step time, one token
per running sequence per step), driven like vLLM's ``bench serve``: one client process,
text prompts, streamed responses, one connection per request, all sent at once.

    python benchmarks/serve_overhead_cpu.py                       # /v1/completions
    python benchmarks/serve_overhead_cpu.py --endpoint chat       # /v1/chat/completions
    python benchmarks/serve_overhead_cpu.py --profile out.svg     # py-spy on the API process
    python benchmarks/serve_overhead_cpu.py --api-server-count 2  # two API processes
    python benchmarks/serve_overhead_cpu.py --data-parallel-size 2  # two stand-in replicas

Reports, per run:

- intake: from the first request sent to the last response's headers (every request
  tokenized, validated and queued for the engine);
- TTFT (first token chunk) and end-to-end output throughput, against the stand-in's own
  ceiling (all tokens in as many steps as the longest output has tokens);
- API CPU: CPU time of the API process (all its threads) per thousand streamed tokens (of
  the first one, when there are several).

The client is plain asyncio (HTTP/1.1 by hand, a ``json.loads`` per SSE event), so its
own cost stays small; on a machine with few cores it still shares them with the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from infer.bench.cpu_sampler import cpu_seconds

MODEL = "smollm2-135m"


@dataclass
class Timing:
    sent: float
    headers: float = 0.0
    first_chunk: float = 0.0  # the first token's chunk, text or not (vLLM's client's TTFT)
    first_token: float = 0.0  # the first chunk with text
    done: float = 0.0
    tokens: int = 0
    error: str = ""


@dataclass
class Report:
    timings: list[Timing] = field(default_factory=list)
    cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def summary(self, step_s: float) -> dict[str, Any]:
        ok = [t for t in self.timings if not t.error]
        start = min(t.sent for t in self.timings)
        end = max(t.done for t in ok)
        tokens = sum(t.tokens for t in ok)
        ttft = sorted(1000 * (t.first_token - t.sent) for t in ok)
        return {
            "requests": len(self.timings),
            "failed": len(self.timings) - len(ok),
            "intake_ms": round(1000 * (max(t.headers for t in ok) - start), 1),
            "ttft_ms_p50": round(statistics.median(ttft), 1),
            "ttft_ms_p90": round(ttft[int(0.9 * (len(ttft) - 1))], 1),
            "output_tok_s": round(tokens / (end - start)),
            "ceiling_tok_s": round(tokens / (max(t.tokens for t in ok) * step_s)),
            "api_cpu_ms_per_1k_tokens": round(1000 * self.cpu_s / tokens * 1000, 2),
            "client_cpu_ms_per_1k_tokens": round(1000 * self.client_cpu_s / tokens * 1000, 2),
            "errors": sorted({t.error for t in self.timings if t.error})[:3],
        }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    parser.add_argument("--num-requests", type=int, default=256)
    lengths: dict[str, Any] = dict(type=int, nargs=2, default=[128, 384], metavar=("MIN", "MAX"))
    parser.add_argument("--input-len", help="prompt tokens", **lengths)
    parser.add_argument("--output-len", help="output tokens", **lengths)
    parser.add_argument("--step-ms", type=float, default=10.0, help="the stand-in's step time")
    parser.add_argument("--runs", type=int, default=2, help="measured runs (after one warm-up)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=Path, help="py-spy the API process into this SVG")
    parser.add_argument("--api-server-count", type=int, default=1, help="API processes")
    parser.add_argument("--data-parallel-size", type=int, default=1, help="stand-in replicas")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser


# --- the server (a child process) -----------------------------------------------------------
def serve(port: int, step_s: float, api_server_count: int, data_parallel_size: int) -> None:
    if api_server_count > 1:  # before prometheus_client is imported, as `infer serve` does
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="metrics-"))
    from infer.config import EngineConfig
    from infer.engine.standin import standin_engine
    from infer.server.bridge.launch import build_server

    config = EngineConfig(model=MODEL, device="cpu", max_batch_size=256)
    factory = partial(standin_engine, step_s=step_s)
    server = build_server(config, port=port, log_level="warning", engine_factory=factory,
                          api_server_count=api_server_count,
                          data_parallel_size=data_parallel_size)  # fmt: skip
    server.run()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("the server exited")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the server did not start")


# --- the client -----------------------------------------------------------------------------
def _prompts(args: argparse.Namespace) -> list[tuple[str, int]]:
    """Text prompts of random tokens (decoded, as vLLM's random dataset does) and their
    output lengths."""
    from infer.loader import resolve_model
    from infer.tokenizer import Tokenizer

    source = resolve_model(MODEL)
    assert source.tokenizer_path is not None
    tokenizer = Tokenizer.load(source.tokenizer_path)
    assert tokenizer is not None
    rng = random.Random(args.seed)
    prompts = []
    for _ in range(args.num_requests):
        ids = [rng.randrange(1000, 40000) for _ in range(rng.randint(*args.input_len))]
        prompts.append((tokenizer.decode(ids), rng.randint(*args.output_len)))
    return prompts


def _body(endpoint: str, prompt: str, max_tokens: int) -> tuple[str, bytes]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", json.dumps(body).encode()
    body["prompt"] = prompt
    return "/v1/completions", json.dumps(body).encode()


async def _request(port: int, path: str, body: bytes, start: asyncio.Event) -> Timing:
    await start.wait()
    timing = Timing(time.perf_counter())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    try:
        status = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        timing.headers = time.perf_counter()
        if b" 200 " not in status:
            timing.error = status.decode().strip()
            return timing
        buffer = b""
        while size := int((await reader.readline()).strip() or b"0", 16):
            buffer += (await reader.readexactly(size + 2))[:-2]
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                _record(timing, event)
        timing.done = time.perf_counter()
    finally:
        writer.close()
    return timing


def _record(timing: Timing, event: bytes) -> None:
    payload = event.removeprefix(b"data: ")
    if not payload or payload == b"[DONE]":
        return
    chunk = json.loads(payload)
    if "error" in chunk:
        timing.error = str(chunk["error"].get("message"))
        return
    for choice in chunk["choices"]:
        text = choice["text"] if "text" in choice else choice["delta"].get("content")
        if text is None:  # a chat's role chunk: no token yet
            continue
        if not timing.first_chunk:
            timing.first_chunk = time.perf_counter()
        if text:
            timing.tokens += 1
            if not timing.first_token:
                timing.first_token = time.perf_counter()


async def _run(port: int, requests: list[tuple[str, bytes]]) -> list[Timing]:
    start = asyncio.Event()
    tasks = [asyncio.create_task(_request(port, path, body, start)) for path, body in requests]
    await asyncio.sleep(0.1)  # every task waits at the start line
    start.set()
    return await asyncio.gather(*tasks)


def main() -> None:
    args = _parser().parse_args()
    step_s = args.step_ms / 1000
    if args.serve is not None:
        serve(args.serve, step_s, args.api_server_count, args.data_parallel_size)
        return
    prompts = _prompts(args)
    requests = [_body(args.endpoint, prompt, max_tokens) for prompt, max_tokens in prompts]
    port = _free_port()
    command = [sys.executable, __file__, "--serve", str(port), "--step-ms", str(args.step_ms),
               "--api-server-count", str(args.api_server_count),
               "--data-parallel-size", str(args.data_parallel_size)]  # fmt: skip
    server = subprocess.Popen(command)
    profiler = None
    try:
        _wait_healthy(port, server)
        asyncio.run(_run(port, requests[:16]))  # warm-up
        if args.profile:
            profiler = subprocess.Popen(
                ["py-spy", "record", "-p", str(server.pid), "-o", str(args.profile), "-r", "200"]
                + (["-f", "raw", "-t"] if args.profile.suffix == ".txt" else [])
            )
            time.sleep(1.0)
        for run in range(args.runs):
            cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
            report = Report(asyncio.run(_run(port, requests)))
            report.cpu_s = cpu_seconds(server.pid) - cpu
            report.client_cpu_s = time.process_time() - client_cpu
            print(json.dumps({"run": run, "endpoint": args.endpoint, **report.summary(step_s)}))
    finally:
        if profiler is not None:
            profiler.send_signal(2)
            profiler.wait()
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
