"""GPU probe (issue 50): what the first burst after ``/health`` compiles, and where an open
dashboard's cost goes. Bounded; every part catches its own errors.

    PYTHONPATH=/tmp/site:$PWD/src python3 probe/warmstart_first_burst.py [--budget-s 230]

1. ``infer serve --model llama-3.2-3b --load-format dummy`` with an empty TRITON_CACHE_DIR
   (start to ready, cold); the cache listed at ready, after burst 1, burst 2, burst 3
   (256 requests at once, in/out U[128,384], temperature 1.0, token-id prompts).
2. Dashboard: bursts with the stream open (a reader in another process, as a browser would
   be) and closed, ABBA; one pair with the reader as a thread of the load generator (as
   ``benchmarks/dashboard_overhead.py`` does).
3. A second start on the same cache (start to ready, warm) and one burst.

Every server process runs ``probe/warmstart_site/sitecustomize.py``: kernel compiles with
their specialisations, engine steps, stack samples, labelled by the window (part) they fell
in. Results: ``$OUT/warmstart/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("OUT", "/tmp/out")) / "warmstart"
PROBE = OUT / "probe"
CACHE = Path("/tmp/warmstart-triton-cache")
SERVE = ["--model", "llama-3.2-3b", "--load-format", "dummy"]
SHAPE = {"num_requests": 256, "cap": 0, "vocab": 128256}  # a CPU try: fewer, shorter requests
T0 = time.monotonic()
RESULTS: dict[str, Any] = {}


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}] {message}", flush=True)


def save() -> None:
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=1))


def set_window(label: str) -> None:
    (PROBE / "window").write_text(label)
    RESULTS.setdefault("windows", []).append([label, time.time()])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def snapshot_cache() -> dict[str, dict[str, Any]]:
    """Each cached kernel: its metadata JSON (the bulky fields dropped)."""
    found: dict[str, dict[str, Any]] = {}
    if not CACHE.is_dir():
        return found
    for entry in CACHE.iterdir():
        for meta in entry.glob("*.json"):
            if meta.name.startswith("__grp__"):
                continue
            try:
                data = json.loads(meta.read_text())
            except (OSError, ValueError):
                continue
            for bulky in ("extern_libs", "supported_fp8_dtypes", "deprecated_fp8_dtypes",
                          "allowed_dot_input_precisions"):  # fmt: skip
                data.pop(bulky, None)
            found[entry.name] = data
    return found


def start_server(tag: str) -> tuple[Any, str]:
    from infer.bench.startup import LoggedProcess

    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT / 'probe' / 'warmstart_site'}:{env.get('PYTHONPATH', '')}"
    env["WARMSTART_PROBE_DIR"] = str(PROBE)
    env["TRITON_CACHE_DIR"] = str(CACHE)
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-m", "infer.cli", "serve", *SERVE, "--port", str(port)]
    server = LoggedProcess.start(command, OUT / f"serve-{tag}.log", env)
    return server, f"http://127.0.0.1:{port}"


def burst(url: str, seed: int) -> dict[str, Any]:
    from infer.bench.http_client import run_serving
    from infer.bench.metrics import summarize
    from infer.workloads import make_workload

    workload = make_workload("serve_burst", SHAPE["vocab"], SHAPE["num_requests"], seed=seed)
    if SHAPE["cap"]:
        workload = workload.capped(SHAPE["cap"])
    begin = time.time()
    _, result = asyncio.run(run_serving(url, workload, progress=False, temperature=1.0))
    summary = summarize(result)
    return {
        "seed": seed,
        "began": begin,
        "wall_s": round(time.time() - begin, 3),
        "output_tok_s": round(summary["output_tok_s"], 1),
        "ttft_ms": summary["ttft_ms"],
        "itl_ms": summary["itl_ms"],
        "failed": summary["num_failed"],
        "errors": summary.get("errors"),
    }


def read_dashboard(url: str) -> None:
    """A browser's part: read frames until killed (run in its own process)."""
    import httpx

    frames = 0
    with httpx.stream("GET", f"{url}/dashboard/stream", timeout=None) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                json.loads(line[5:])
                frames += 1
                print(frames, flush=True)


@contextmanager
def dashboard(url: str, how: str):  # type: ignore[no-untyped-def]
    if how == "closed":
        yield
        return
    if how == "process":
        reader = subprocess.Popen(
            [sys.executable, __file__, "--read-dashboard", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)
        try:
            yield
        finally:
            reader.terminate()
            reader.wait(10)
        return
    stop = threading.Event()

    def read() -> None:
        import httpx

        with httpx.stream("GET", f"{url}/dashboard/stream", timeout=None) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    json.loads(line[5:])
                if stop.is_set():
                    return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    time.sleep(1.0)
    try:
        yield
    finally:
        stop.set()


def part(name: str, fn, *args):  # type: ignore[no-untyped-def]
    log(f"part {name}")
    try:
        value = fn(*args)
        RESULTS[name] = value
        log(f"  {name}: {json.dumps(value)[:400]}")
        return value
    except Exception as exc:
        RESULTS[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        log(f"  {name} FAILED: {exc}")
        return None
    finally:
        save()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-s", type=float, default=230.0)
    parser.add_argument("--read-dashboard")
    parser.add_argument("--serve", default=" ".join(SERVE), help="infer serve flags")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--cap-tokens", type=int, default=0)
    args = parser.parse_args()
    SERVE[:] = args.serve.split()
    SHAPE.update(num_requests=args.num_requests, cap=args.cap_tokens, vocab=args.vocab)
    if args.read_dashboard:
        read_dashboard(args.read_dashboard)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    PROBE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(CACHE, ignore_errors=True)
    CACHE.mkdir(parents=True)
    deadline = T0 + args.budget_s

    def left() -> float:
        return deadline - time.monotonic()

    set_window("cold-start")
    server, url = start_server("cold")
    try:
        ready = part("cold_ready_s", server.wait_ready, url, min(150.0, left()))
        if ready is None:
            return
        from infer.bench.startup import INFER_MARKERS, find_markers

        RESULTS["cold_markers"] = find_markers(server.lines, INFER_MARKERS)
        snapshots = {"ready": snapshot_cache()}
        for i in (1, 2, 3):
            set_window(f"burst{i}")
            part(f"burst{i}", burst, url, 100 + i)
            snapshots[f"after_burst{i}"] = snapshot_cache()
        names = ["ready", "after_burst1", "after_burst2", "after_burst3"]
        diff = {}
        for before, after in zip(names, names[1:]):
            new = sorted(set(snapshots[after]) - set(snapshots[before]))
            diff[after] = [snapshots[after][h] for h in new]
        RESULTS["cache_at_ready"] = sorted(
            (meta.get("name", "?"), h) for h, meta in snapshots["ready"].items()
        )
        RESULTS["cache_new"] = diff
        save()
        order = ["closed", "process", "process", "closed", "closed", "thread", "thread", "closed"]
        for i, how in enumerate(order):
            if left() < 70:
                log("dashboard: out of time")
                break
            set_window(f"dash{i}-{how}")
            with dashboard(url, how):
                part(f"dash{i}-{how}", burst, url, 200 + i)
    finally:
        set_window("stop")
        RESULTS["cold_exit"] = server.stop(grace_s=20)
        save()
    if left() < 45:
        log("warm start: out of time")
        return
    set_window("warm-start")
    server, url = start_server("warm")
    try:
        if part("warm_ready_s", server.wait_ready, url, min(100.0, left())) is not None:
            from infer.bench.startup import INFER_MARKERS, find_markers

            RESULTS["warm_markers"] = find_markers(server.lines, INFER_MARKERS)
            if left() > 15:
                set_window("warm-burst1")
                part("warm_burst1", burst, url, 300)
    finally:
        set_window("stop2")
        server.stop(grace_s=20)
        save()


if __name__ == "__main__":
    try:
        main()
    finally:
        save()
        log("done")
