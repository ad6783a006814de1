"""Ready means warm (issue 50): start to ready on an empty and on a warm kernel cache, the
first burst after ready against the second, and what an open dashboard costs a burst.

    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/warm_start.py [--pairs 3] \\
        [--results-dir DIR] [-- SERVE FLAGS]

1. Cold: ``infer serve`` (llama-3.2-3b, dummy weights, unless flags follow ``--``) with
   ``INFER_CACHE_DIR`` an empty folder and ``TRITON_CACHE_DIR`` unset (so the kernel cache
   is the one under it); ready = ``GET /health`` answers 200. Bursts 1 and 2 after ready:
   ``serve_burst`` (256 requests at once, prompts and outputs U[128, 384] tokens),
   temperature 1.0, as ``vllm bench serve`` sends them to a server at its defaults; each
   burst on prompts of its own, sent by ``infer bench serve`` (no warm-up requests) in a
   process of its own. Then the dashboard: ``burst256`` (greedy, as
   ``dashboard_overhead.py`` and ``results-by-topic/10-host-overheads.md``, 10.3) with the
   stream closed and open (read by
   another process, as a browser does) in ABBA order, ``--pairs`` pairs.
2. Warm: the same server on the same ``INFER_CACHE_DIR``: start to ready, bursts 1 and 2.

Writes ``results.json`` and each server's log (the start-up's parts with the kernel
variants each built) to the results folder (``$OUT/warm-start`` on the device machine),
counts the log lines of variants built after start-up (none expected), and the variants of
each kernel in the cache after each start (a warm start adds none when it compiled nothing).
About 4 minutes on an H100.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import Any

# The servers' environment as this process got it (importing torch here may change ours).
SERVER_ENV = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}

from dashboard_overhead import dashboard_open  # noqa: E402 (the benchmarks folder)
from infer.bench.startup import INFER_MARKERS, LoggedProcess, find_markers  # noqa: E402
from infer.config import ModelConfig  # noqa: E402
from infer.loader import resolve_model  # noqa: E402

SERVE = ["--model", "llama-3.2-3b", "--load-format", "dummy"]
SHAPE: dict[str, int | None] = {"num_requests": None, "max_tokens": None}  # a CPU try: less
LATE_BUILD = "kernel variant built after start-up"
BURST_TIMEOUT_S = 300.0
START_UP = "start-up: "


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _burst(url: str, workload: str, vocab: int, seed: int, temperature: float) -> dict[str, Any]:
    """One burst sent by ``infer bench serve`` in a process of its own, so that every burst's
    client starts alike (a first burst would otherwise carry the client's own first use)."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "burst.json"
        command = [
            sys.executable, "-m", "infer.cli", "bench", "serve", "--url", url,
            "--workload", workload, "--vocab-size", str(vocab), "--seed", str(seed),
            "--temperature", str(temperature), "--warmup", "0", "--no-progress",
            "--output", str(output),
        ]  # fmt: skip
        for flag, value in SHAPE.items():
            if value is not None:
                command += [f"--{flag.replace('_', '-')}", str(value)]
        done = subprocess.run(
            command, env=SERVER_ENV, capture_output=True, text=True, timeout=BURST_TIMEOUT_S
        )
        if not output.exists():  # (it exits 1 when requests failed; they are counted)
            raise RuntimeError(
                f"infer bench serve failed ({done.returncode}):\n{done.stderr[-2000:]}"
            )
        summary = json.loads(output.read_text())
    return {
        "workload": workload,
        "temperature": temperature,
        "seed": seed,
        "output_tok_s": summary["output_tok_s"],
        "ttft_ms": summary["ttft_ms"],
        "itl_ms": summary["itl_ms"],
        "duration_s": summary["duration_s"],
        "failed": summary["num_failed"],
    }


def _first_and_second(url: str, vocab: int, seed: int) -> dict[str, Any]:
    first = _burst(url, "serve_burst", vocab, seed, 1.0)
    second = _burst(url, "serve_burst", vocab, seed + 1, 1.0)
    print(json.dumps({"first": first, "second": second}), flush=True)
    return {
        "first": first,
        "second": second,
        "tok_s_first_over_second": _ratio(first["output_tok_s"], second["output_tok_s"]),
        "ttft_p50_first_over_second": _ratio(first["ttft_ms"]["p50"], second["ttft_ms"]["p50"]),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _dashboard(url: str, vocab: int, pairs: int) -> dict[str, Any]:
    order = [opened for p in range(pairs) for opened in ((False, True), (True, False))[p % 2]]
    runs = []
    for i, opened in enumerate(order):
        with dashboard_open(url) if opened else nullcontext([0]) as frames:
            run = _burst(url, "burst256", vocab, 500 + i, 0.0)
        run.update(dashboard=opened, frames=frames[0])
        print(json.dumps(run), flush=True)
        runs.append(run)
    closed = [r["output_tok_s"] for r in runs if not r["dashboard"]]
    opened_ = [r["output_tok_s"] for r in runs if r["dashboard"]]
    pair_losses = [
        1 - sum(r["output_tok_s"] for r in pair if r["dashboard"])
        / sum(r["output_tok_s"] for r in pair if not r["dashboard"])
        for pair in (runs[2 * p : 2 * p + 2] for p in range(pairs))
    ]  # fmt: skip
    return {
        "runs": runs,
        "closed_tok_s_median": statistics.median(closed),
        "open_tok_s_median": statistics.median(opened_),
        "loss_pct_of_medians": 100 * (1 - statistics.median(opened_) / statistics.median(closed)),
        "loss_pct_per_pair": [100 * loss for loss in pair_losses],
        "loss_pct_median_of_pairs": 100 * statistics.median(pair_losses),
    }


def _kernels_cached(cache: Path) -> dict[str, int]:
    """How many variants of each kernel the kernel cache (``triton/`` under ``cache``) holds,
    one metadata file each: a warm start that adds any compiled them again."""
    kernels = (cache / "triton").rglob("*.json")
    names = Counter(p.stem for p in kernels if not p.name.startswith("__grp__"))
    return dict(sorted(names.items()))


def _serve(
    tag: str, serve: list[str], cache: Path, out: Path, work: Any, timeout_s: float
) -> dict[str, Any]:
    """Start the server, wait for ready, run ``work(url)``, stop it; its record."""
    port = _port()
    env = {**SERVER_ENV, "INFER_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "infer.cli", "serve", *serve, "--port", str(port)]
    server = LoggedProcess.start(command, out / f"serve-{tag}.log", env)
    record: dict[str, Any] = {}
    try:
        record["ready_s"] = server.wait_ready(f"http://127.0.0.1:{port}", timeout_s)
        print(f"{tag}: ready after {record['ready_s']:.1f} s", flush=True)
        record["markers"] = find_markers(server.lines, INFER_MARKERS)
        record.update(work(f"http://127.0.0.1:{port}"))
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        print(f"{tag}: {record['error']}", flush=True)
    finally:
        record["exit_code"] = server.stop()
    lines = [line for _, line in server.lines]
    record["start_up_log"] = [line for line in lines if START_UP in line]
    record["late_kernel_builds"] = [line for line in lines if LATE_BUILD in line]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="dashboard ABBA pairs (0: none)")
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--num-requests", type=int, help="per burst (a CPU try)")
    parser.add_argument("--max-tokens", type=int, help="output cap (a CPU try)")
    parser.add_argument("serve", nargs="*", help="infer serve flags, after --")
    args = parser.parse_args()
    serve = args.serve or SERVE
    SHAPE.update(num_requests=args.num_requests, max_tokens=args.max_tokens)
    default = Path(os.environ.get("OUT", "benchmarks/results")) / "warm-start"
    out = args.results_dir or default
    out.mkdir(parents=True, exist_ok=True)
    model = serve[serve.index("--model") + 1]
    vocab = ModelConfig.from_hf_dict(resolve_model(model).hf_config).vocab_size
    cache = Path(tempfile.mkdtemp(prefix="infer-cache-"))
    results: dict[str, Any] = {"serve": serve, "infer_cache_dir": str(cache)}

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=1))

    try:
        started = time.monotonic()

        def cold_work(url: str) -> dict[str, Any]:
            bursts = _first_and_second(url, vocab, 100)
            dashboard = _dashboard(url, vocab, args.pairs) if args.pairs else None
            return {"bursts": bursts, "dashboard": dashboard}

        results["cold"] = _serve("cold", serve, cache, out, cold_work, args.ready_timeout)
        results["cold"]["kernels_cached"] = _kernels_cached(cache)
        save()
        results["warm"] = _serve(
            "warm", serve, cache, out, lambda url: {"bursts": _first_and_second(url, vocab, 300)},
            args.ready_timeout,
        )  # fmt: skip
        results["warm"]["kernels_cached"] = _kernels_cached(cache)
        results["kernel_cache_files"] = sum(1 for p in cache.rglob("*") if p.is_file())
        results["wall_s"] = time.monotonic() - started
    finally:
        save()
        shutil.rmtree(cache, ignore_errors=True)
    _print_summary(results)


def _print_summary(results: dict[str, Any]) -> None:
    for tag in ("cold", "warm"):
        record = results.get(tag, {})
        print(f"{tag}: start to ready {record.get('ready_s', float('nan')):.1f} s", end="")
        bursts = record.get("bursts")
        if bursts:
            first, second = bursts["first"], bursts["second"]
            print(
                f"; first burst {first['output_tok_s']:,.0f} tok/s, TTFT p50 "
                f"{first['ttft_ms']['p50']} ms; second {second['output_tok_s']:,.0f} tok/s, "
                f"{second['ttft_ms']['p50']} ms (first / second: tok/s "
                f"{bursts['tok_s_first_over_second']}, "
                f"TTFT {bursts['ttft_p50_first_over_second']})",
                end="",
            )
        print(f"; late kernel builds: {len(record.get('late_kernel_builds', []))}")
    dash = results.get("cold", {}).get("dashboard")
    if dash:
        print(
            f"dashboard: closed {dash['closed_tok_s_median']:,.0f}, open "
            f"{dash['open_tok_s_median']:,.0f} tok/s (medians): loss "
            f"{dash['loss_pct_of_medians']:.2f} %; per pair {dash['loss_pct_per_pair']}"
        )


if __name__ == "__main__":
    main()
