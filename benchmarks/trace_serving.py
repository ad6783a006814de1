"""Where a served burst's time goes (diagnosis, GPU): ``infer serve`` with its engine traced
(``step_trace.py``) and its API process's intake timed, under text prompts from one asyncio
client; then the same prompts (as the server tokenized them) through the engine in-process.

    python benchmarks/trace_serving.py --model .cache/ckpt-llama-3.2-3b --out /tmp/trace

Workloads: ``burst`` (256 prompts at once, 128-384 tokens in and out, as vLLM's ``bench serve``
random dataset makes them: random ids decoded to text) run twice (the first warms up),
``poisson`` (64 prompts of 1,024-2,048 tokens at 6 req/s, 64-256 out). Writes
``engine-<run>.jsonl`` (the engine's steps), ``api.jsonl`` (each request's submit and first
token dispatch), ``client-<run>.json`` (send, first token, done per request) and
``offline-burst.jsonl``; prints each run's client summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from infer.config import EngineConfig
from infer.contract.messages import EngineInfo
from infer.engine.process import ServedEngine, load_engine
from serve_overhead_cpu import Timing, _free_port, _request, _wait_healthy
from step_trace import trace_engine

SERVED = "traced"


def traced_engine(config: EngineConfig, path: str) -> tuple[ServedEngine, EngineInfo]:
    """An ``engine_factory``: the real engine, traced into ``path``."""
    engine, info = load_engine(config)
    trace_engine(engine, Path(path))  # type: ignore[arg-type]
    return engine, info


def _trace_api(path: Path) -> None:
    """Time each request's reservation (its HTTP request parsed and validated), its start
    (sent to the engine, from the tokenizer thread) and its first dispatched token, in the
    API process."""
    from infer.server.bridge import engine_client

    out = path.open("a")
    lock = threading.Lock()
    reserve = engine_client.EngineClient.reserve
    start_job = engine_client.EngineClient.start_job
    add = engine_client.Job._add

    def write(event: str, job_id: str) -> None:
        line = json.dumps({"ev": event, "t": time.perf_counter(), "id": job_id}) + "\n"
        with lock:
            out.write(line)

    def traced_reserve(self: Any, job_id: str, count: int) -> Any:
        write("reserve", job_id)
        return reserve(self, job_id, count)

    def traced_start(self: Any, job: Any, sequences: Any) -> None:
        start_job(self, job, sequences)
        write("submit", job.request_ids[0])

    def traced_add(self: Any, index: int, token_ids: Any, *args: Any) -> Any:
        if token_ids and not self.token_times[index]:
            write("first", self.request_ids[index])
            with lock:
                out.flush()
        return add(self, index, token_ids, *args)

    engine_client.EngineClient.reserve = traced_reserve  # type: ignore[method-assign]
    engine_client.EngineClient.start_job = traced_start  # type: ignore[method-assign]
    engine_client.Job._add = traced_add  # type: ignore[method-assign]


def serve(model: str, port: int, out: Path, engine_args: dict[str, Any]) -> None:
    from infer.server.bridge.launch import build_server

    _trace_api(out / "api.jsonl")
    config = EngineConfig(model=model, load_format="dummy", max_seq_len=4096, **engine_args)
    factory = partial(traced_engine, path=str(out / "engine.jsonl"))
    build_server(
        config, port=port, served_model_name=SERVED, log_level="warning", engine_factory=factory
    ).run()


def make_prompts(
    model: str, count: int, lengths: tuple[int, int], outputs: tuple[int, int], seed: int
) -> list[tuple[str, int]]:
    """Text prompts of random ids decoded (vLLM's random dataset), with output lengths."""
    from infer.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(Path(model))
    assert tokenizer is not None
    rng = random.Random(seed)
    vocab = len(tokenizer.hf)
    return [
        (
            tokenizer.decode([rng.randrange(vocab) for _ in range(rng.randint(*lengths))]),
            rng.randint(*outputs),
        )
        for _ in range(count)
    ]


def _body(prompt: str, max_tokens: int) -> bytes:
    body = {
        "model": SERVED,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(body).encode()


async def _run(port: int, prompts: list[tuple[str, int]], gaps: list[float]) -> list[Timing]:
    start = asyncio.Event()
    tasks = []
    for (prompt, max_tokens), gap in zip(prompts, gaps, strict=True):
        tasks.append(
            asyncio.create_task(_request(port, "/v1/completions", _body(prompt, max_tokens), start))
        )
        if gap:
            start.set()
            await asyncio.sleep(gap)
    start.set()
    return await asyncio.gather(*tasks)


def _py_spy(server_pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy (raw samples) on the server's engine process (its spawned child)."""
    children = subprocess.run(
        ["pgrep", "-f", "-P", str(server_pid), "spawn_main"], capture_output=True, text=True
    ).stdout.split()
    if not children:
        return None
    command = ["py-spy", "record", "-p", children[0], "-r", "500", "-f", "raw", "-o", str(out)]
    spy = subprocess.Popen([*command, "--nonblocking"])
    time.sleep(1.0)
    return spy


def client_summary(timings: list[Timing]) -> dict[str, Any]:
    ok = [t for t in timings if not t.error and t.first_token]
    first = min(t.sent for t in timings)
    ttft = sorted(1000 * (t.first_chunk - t.sent) for t in ok)
    tokens = sum(t.tokens for t in ok)
    return {
        "requests": len(timings),
        "failed_or_silent": len(timings) - len(ok),
        "output_tok_s": round(tokens / (max(t.done for t in ok) - first)),
        "ttft_ms_p50": round(statistics.median(ttft), 1),
        "ttft_ms_p90": round(ttft[int(0.9 * (len(ttft) - 1))], 1),
        "ttft_text_ms_p50": round(
            statistics.median(1000 * (t.first_token - t.sent) for t in ok), 1
        ),
        "first_token_s": [round(x, 3) for x in sorted(t.first_chunk - first for t in ok)][::16],
    }


def offline_burst(model: str, prompts: list[tuple[str, int]], path: Path) -> dict[str, Any]:
    """The burst's prompts, tokenized as the server does, through the engine in-process."""
    from infer import LLM, SamplingParams

    llm = LLM(model, load_format="dummy", max_seq_len=4096)
    assert llm.engine.tokenizer is not None
    ids = [llm.engine.tokenizer.encode_batch([p], True)[0] for p, _ in prompts]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in prompts]
    llm.generate(ids[:8], params[:8], use_tqdm=False)  # warm-up
    trace_engine(llm.engine, path)
    start = time.perf_counter()
    results = llm.generate(ids, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(r.outputs[0].token_ids) for r in results)
    ttft = sorted(1000 * (r.outputs[0].ttft_s or 0.0) for r in results)
    return {
        "output_tok_s": round(tokens / elapsed),
        "ttft_ms_p50": round(statistics.median(ttft), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--engine-args", default="{}", help="EngineConfig fields as JSON")
    parser.add_argument("--no-offline", action="store_true")
    parser.add_argument(
        "--py-spy", action="store_true", help="sample the engine process during the burst"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    engine_args = json.loads(args.engine_args)
    if args.serve is not None:
        serve(args.model, args.serve, args.out, engine_args)
        return
    warmup = make_prompts(args.model, 256, (128, 384), (128, 384), seed=10)
    burst = make_prompts(args.model, 256, (128, 384), (128, 384), seed=0)
    poisson = make_prompts(args.model, 64, (1024, 2048), (64, 256), seed=1)
    rng = random.Random(2)
    poisson_gaps = [rng.expovariate(6.0) for _ in poisson]
    port = _free_port()
    command = [sys.executable, __file__, "--model", args.model, "--out", str(args.out)]
    command += ["--serve", str(port), "--engine-args", args.engine_args]
    server = subprocess.Popen(command)
    report: dict[str, Any] = {}
    try:
        _wait_healthy(port, server)
        runs = [("warmup", warmup, [0.0] * 256), ("burst", burst, [0.0] * 256)]
        runs.append(("poisson", poisson, poisson_gaps))
        for name, prompts, gaps in runs:
            engine_trace = args.out / "engine.jsonl"
            time.sleep(0.5)
            mark = engine_trace.stat().st_size if engine_trace.exists() else 0
            spy = None
            if args.py_spy and name == "burst":
                spy = _py_spy(server.pid, args.out / "engine-spy.txt")
            timings = asyncio.run(_run(port, prompts, gaps))
            if spy is not None:
                spy.send_signal(2)
                spy.wait()
            report[name] = client_summary(timings)
            report[name]["engine_trace_offset"] = mark
            (args.out / f"client-{name}.json").write_text(json.dumps([asdict(t) for t in timings]))
            print(name, json.dumps(report[name]), flush=True)
    finally:
        server.terminate()
        server.wait(60)
    if not args.no_offline:
        report["offline_burst"] = offline_burst(args.model, burst, args.out / "offline-burst.jsonl")
        print("offline_burst", json.dumps(report["offline_burst"]), flush=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
