"""Reliability checks of ``infer serve`` (issues 33 and 42), each against a server it starts:

    python benchmarks/reliability_probe.py hostile
    python benchmarks/reliability_probe.py lockout --idle 500 --slow 50 -- \\
        --max-batch-size 4 --max-waiting-requests 8
    python benchmarks/reliability_probe.py cache-stats
    python benchmarks/reliability_probe.py kill-engine
    python benchmarks/reliability_probe.py security

- ``hostile``: the request bodies that crashed or stalled the server in issue 33's probe
  (grammar bombs, 100,000-entry lists, deep nesting, oversized inputs), one after another,
  while innocent streams run beside them and ``/health`` is polled every 20 ms: each one's
  answer, the 5xx among them, the innocent streams' tokens against the same requests on the
  quiet server, ``/health``'s latencies, and whether the server and its engine survived.

- ``lockout``: requests, one a second, on fresh connections, first on an unloaded server, then
  while ``--idle`` silent and ``--slow`` header-trickling connections are held open (those
  the server closes are opened again each second): their statuses and latencies.
- ``cache-stats``: ``/v1/cache/stats`` rates after a burst of traffic on a fresh server,
  then after another one a quiet window later, each read twice in a row, against the
  allocations counted over the stated window (``rate_window_s``, 10 s where the server
  states none; the burst must be shorter than that).
- ``kill-engine``: ``kill -9`` of the engine process while a stream runs: how the stream
  ends, what ``/health`` says meanwhile, and whether (and when) the server exits.
- ``security``: issue 53's attacks on a server with ``--api-key`` (``security_attacks``
  below), one after another while ``/health`` is polled every 20 ms: each one's answer, the
  seconds to it (and the bytes sent by then), the API process's peak memory during it and
  its memory a second after, and the slowest ``/health`` meanwhile. Sizes scale with
  ``--upload-mb`` (the issue's: 2048); ``--flood`` 7 MB ``/tokenize`` requests go at once.

Arguments after ``--`` go to ``infer serve`` (``--model smollm2-135m --device cpu`` are
given). ``--src DIR`` serves another checkout's ``src`` (e.g. an export of an older commit),
the probe itself running from this one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from infer.bench.idle_connections import IdleConnections
from infer.server.bridge.launch import ServerProcess, spawn_server
from security_attacks import SECURITY_ARGS, security

BASE_ARGS = ["--model", "smollm2-135m", "--device", "cpu"]
# One token: a single engine step, so the CPU's noise weighs less on the latency.
REQUEST = {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
LONG = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
DEFAULT_WINDOW_S = 10.0


def timed_request(url: str) -> tuple[str, float]:
    """The status (or the error's name) and seconds of one completion on a new connection."""
    start = time.perf_counter()
    try:
        response = httpx.post(f"{url}/v1/completions", json=REQUEST, timeout=60)
        outcome = str(response.status_code)
        if response.status_code != 200:
            outcome += f" {response.json().get('error', {}).get('code')}"
    except httpx.HTTPError as exc:
        outcome = type(exc).__name__
    return outcome, time.perf_counter() - start


def one_a_second(url: str, count: int) -> list[tuple[str, float]]:
    results = []
    for _ in range(count):
        tick = time.monotonic() + 1.0
        results.append(timed_request(url))
        time.sleep(max(0.0, tick - time.monotonic()))
    return results


def summary(results: list[tuple[str, float]]) -> str:
    outcomes: dict[str, int] = {}
    for outcome, _ in results:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    latencies = [seconds * 1000 for outcome, seconds in results if outcome == "200"]
    timing = (
        f"p50 {statistics.median(latencies):.0f} ms, max {max(latencies):.0f} ms"
        if latencies
        else "no 200"
    )
    codes = ", ".join(f"{n} x {outcome}" for outcome, n in sorted(outcomes.items()))
    return f"{codes}; {timing}"


def _hostile_bodies() -> list[tuple[str, str, Any]]:
    """(what, route, body) of each hostile request: those that crashed the server or stalled
    it in issue 33's probe, and the nesting and sizes beside them. A body is a JSON value, or
    bytes where it nests deeper than Python's encoder goes."""
    chain = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(20_000))
    chain += 'r20000: "b"\n'
    deep = '{"type": "array", "items": ' * 10_000 + '{"type": "string"}' + "}" * 10_000
    tool = f'[{{"type": "function", "function": {{"name": "f", "parameters": {deep}}}}}]'
    choices = [f"option number {i}" for i in range(100_000)]
    user = [{"role": "user", "content": "hi"}]
    chat = {"messages": user, "max_tokens": 4}
    return [
        ("grammar, 20,000 chained rules", "completions",
         {"structured_outputs": {"grammar": chain}}),
        ("grammar, chat", "chat", {"messages": user, "structured_outputs": {"grammar": chain}}),
        ("choice, 100,000 entries", "completions", {"structured_outputs": {"choice": choices}}),
        ("json schema, 10,000 deep", "completions",
         _raw({"prompt": "Hi", "max_tokens": 4}, "structured_outputs", f'{{"json": {deep}}}')),
        ("regex, 10,000 nested groups", "completions",
         {"structured_outputs": {"regex": "(" * 10_000 + "a" + ")" * 10_000}}),
        ("tool schema, 10,000 deep", "chat", _raw(chat, "tools", tool)),
        ("prompt, lists 100,000 deep", "completions",
         _raw({"max_tokens": 4}, "prompt", "[" * 100_000 + "]" * 100_000)),
        ("stop, 100,000 strings", "completions", {"stop": ["x"] * 100_000}),
        ("logit_bias, 100,000 entries", "completions",
         {"logit_bias": {str(i): 1 for i in range(100_000)}}),
        ("n, 100,000", "completions", {"n": 100_000}),
        ("max_tokens, 2**40", "completions", {"max_tokens": 2**40}),
        ("prompt, 9 MB", "completions", {"prompt": "x" * 9_000_000}),
        ("messages, 100,000", "chat", {"messages": user * 100_000}),
    ]  # fmt: skip


def _raw(fields: dict[str, Any], name: str, value: str) -> bytes:
    """``fields`` as JSON with ``name`` set to ``value``, JSON text written by hand."""
    return (json.dumps(fields)[:-1] + f', "{name}": {value}}}').encode()


def _encoded(route: str, body: Any) -> bytes:
    """``body`` (a JSON value, or bytes sent as they are) as the bytes POSTed to ``route``."""
    if isinstance(body, bytes):
        return body
    extra = {"prompt": "Hi"} if route == "completions" else {}
    return json.dumps({"max_tokens": 4, **extra, **body}).encode()


def _send_raw(url: str, route: str, content: bytes) -> str:
    """POST ``content``; the status and error code."""
    path = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}[route]
    try:
        response = httpx.post(f"{url}{path}", content=content, timeout=120,
                              headers={"content-type": "application/json"})  # fmt: skip
    except httpx.HTTPError as exc:
        return type(exc).__name__
    code = ""
    if response.status_code != 200:
        try:
            error = response.json().get("error", {})
            code = f" {error.get('param') or error.get('code')}"
        except ValueError:
            code = " (not JSON)"
    return f"{response.status_code}{code}"


def _innocent(url: str, stop: threading.Event, seen: list[str]) -> None:
    """Greedy streams, one after another until ``stop`` (at least one): each one's text."""
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    while True:
        text = ""
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["text"]
        seen.append(text)
        if stop.is_set():
            return


def hostile(server: ServerProcess, args: argparse.Namespace) -> None:
    engine_pid = server.engine_pid()
    # Encoded before the poller starts: encoding 100,000 entries holds this process's GIL
    # for 0.1-0.2 s, which stalled the /health poller beside it (not the server), and that
    # was counted as the server's latency.
    hostile_requests = [(what, route, _encoded(route, body))
                        for what, route, body in _hostile_bodies()]  # fmt: skip
    reference: list[str] = []
    stop = threading.Event()
    stop.set()
    _innocent(server.url, stop, reference)  # one stream, on the quiet server
    stop.clear()
    probes: list[tuple[float, float]] = []  # (sent at, seconds to a 200; inf: not a 200)
    innocent: list[str] = []

    def probe() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                start = time.perf_counter()
                status = client.get(f"{server.url}/health").status_code
                seconds = time.perf_counter() - start
                probes.append((start, seconds if status == 200 else float("inf")))
                time.sleep(0.02)

    threads = [threading.Thread(target=probe), threading.Thread(
        target=_innocent, args=(server.url, stop, innocent))]  # fmt: skip
    for thread in threads:
        thread.start()
    rows = []
    try:
        for what, route, content in hostile_requests:
            start = time.perf_counter()
            outcome = _send_raw(server.url, route, content)
            rows.append((what, outcome, start, time.perf_counter()))
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    print("| request | answer | seconds | slowest /health meanwhile |\n|---|---|---:|---:|")
    for what, outcome, start, end in rows:
        beside = [seconds for sent, seconds in probes if start <= sent + seconds and sent <= end]
        print(f"| {what} | {outcome} | {end - start:.2f} | {max(beside, default=0) * 1e3:.0f} ms |")
    server_errors = sum(outcome[0] == "5" or not outcome[0].isdigit() for _, outcome, *_ in rows)
    wrong = sum(text != reference[0] for text in innocent)
    latencies = sorted(seconds for _, seconds in probes)
    p99 = latencies[int(len(latencies) * 0.99)]
    alive = server.process.poll() is None and server.engine_pid() == engine_pid
    print(f"5xx or no answer: {server_errors} of {len(rows)}")
    print(f"innocent streams: {len(innocent)}, {wrong} unlike the quiet server's")
    print(f"/health: {len(latencies)} probes, p50 {statistics.median(latencies) * 1e3:.1f} ms,"
          f" p99 {p99 * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms")  # fmt: skip
    print(f"server and engine alive, the same engine process: {alive}")


def lockout(server: ServerProcess, args: argparse.Namespace) -> None:
    print(f"unloaded:       {summary(one_a_second(server.url, args.requests))}")
    host, port = httpx.URL(server.url).host, httpx.URL(server.url).port
    assert port is not None
    with IdleConnections((host, port), args.idle, args.slow) as held:
        print(f"holding {held.open} connections ({args.idle} idle, {args.slow} slow)")
        loaded = one_a_second(server.url, args.requests)
        counts = held.counts
    print(f"beside them:    {summary(loaded)}")
    print(f"attacker: {counts.opened} opened, {counts.closed_by_server} closed by the "
          f"server, {counts.failed_to_connect} failed to connect")  # fmt: skip


def cache_stats(server: ServerProcess, args: argparse.Namespace) -> None:
    def read() -> dict[str, Any]:
        return dict(httpx.get(f"{server.url}/v1/cache/stats", timeout=30).json())

    def burst() -> float:
        start = time.monotonic()
        for _ in range(args.requests):
            timed_request(server.url)
        return time.monotonic() - start

    before = 0  # a fresh server has allocated nothing
    for label in ("fresh server", "after a quiet window"):
        seconds = burst()
        reads = [read(), read()]  # the first report ever, on a fresh server
        window = float(reads[0].get("rate_window_s", DEFAULT_WINDOW_S))
        counted = int(reads[-1]["total_allocations"]) - before
        print(f"{label}: {args.requests} requests in {seconds:.1f} s allocated {counted} "
              f"blocks: {counted / window:.1f}/s over the last {window:.0f} s")  # fmt: skip
        for i, stats in enumerate(reads, 1):
            print(f"  read {i}: allocs_per_s {stats['allocs_per_s']:.6g}, "
                  f"frees_per_s {stats['frees_per_s']:.6g}")  # fmt: skip
        time.sleep(window + 0.5)
        quiet = read()
        print(f"  {window:.0f} s later: allocs_per_s {quiet['allocs_per_s']:.6g}")
        before = int(quiet["total_allocations"])


def kill_engine(server: ServerProcess, args: argparse.Namespace) -> None:
    events: list[str] = []
    streaming = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=LONG, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    streaming.set()

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    streaming.wait(60)
    os.kill(server.engine_pid(), signal.SIGKILL)
    killed = time.monotonic()
    health: dict[str, int] = {}
    exit_code = None
    while time.monotonic() - killed < args.wait:
        try:
            status = str(httpx.get(f"{server.url}/health", timeout=1).status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        health[status] = health.get(status, 0) + 1
        if (exit_code := server.process.poll()) is not None:
            break
        time.sleep(0.05)
    exited = time.monotonic() - killed
    reader.join(5)
    print(f"stream: {len(events)} events; it ended with {events[-2:]}")
    print(f"/health after the kill: {health}")
    if exit_code is None:
        print(f"the server still runs {args.wait:.0f} s after the kill")
    else:
        print(f"the server exited {exited:.2f} s after the kill, exit code {exit_code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "check", choices=["hostile", "lockout", "cache-stats", "kill-engine", "security"]
    )
    parser.add_argument("--idle", type=int, default=1000, help="silent connections (lockout)")
    parser.add_argument("--slow", type=int, default=100, help="trickling connections (lockout)")
    parser.add_argument("--requests", type=int, default=20, help="requests per phase")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds watched after kill")
    parser.add_argument(
        "--upload-mb",
        type=int,
        default=2048,
        help="the largest upload (security; the others scale with it)",
    )
    parser.add_argument(
        "--flood", type=int, default=50, help="7 MB /tokenize requests sent at once (security)"
    )
    parser.add_argument("--src", type=Path, help="serve this src directory instead")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    serve_args = argv[split + 1 :]
    if args.src is not None:
        os.environ["PYTHONPATH"] = str(args.src.resolve())
        print(f"# serving {args.src}")
    else:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
        print(f"# this checkout: {commit}")
    if args.check == "security":
        serve_args = [*SECURITY_ARGS, *serve_args]
    print(f"# {args.check}: infer serve {' '.join(BASE_ARGS + serve_args)}")
    check = {"hostile": hostile, "lockout": lockout, "cache-stats": cache_stats,
             "kill-engine": kill_engine, "security": security}  # fmt: skip
    with spawn_server([*BASE_ARGS, *serve_args], access_log=args.check == "security") as server:
        check[args.check](server, args)


if __name__ == "__main__":
    main()
