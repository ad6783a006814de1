"""Issue 53's attacks on a server with ``--api-key``, for ``reliability_probe.py security``.

Each attack runs alone while ``/health`` is polled every 20 ms; its row gives the answer
(the status, and the error's code or param), the seconds to it (and, for an upload, the
bytes sent by then), the API process's peak resident memory during it (``VmHWM``, reset
before each attack through ``/proc/PID/clear_refs``) and its memory a second after, and the
slowest ``/health`` meanwhile. The last attack is a SIGTERM: it ends the server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from infer.server.bridge.launch import ServerProcess

KEY = "sk-probe-key-53"
AUTH = {"Authorization": f"Bearer {KEY}"}
SHUTDOWN_TIMEOUT_S = 3.0
SECURITY_ARGS = ["--api-key", KEY, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
MB = 1024 * 1024
_CHUNK = MB
_STATUS = re.compile(rb"^HTTP/1\.[01] (\d{3})")


@dataclass
class Outcome:
    answer: str
    seconds: float
    sent: int | None = None  # bytes of the body sent when the answer came


class ApiMemory:
    """The API process's resident memory: now, and its peak since ``reset``."""

    def __init__(self, pid: int) -> None:
        self.status = Path(f"/proc/{pid}/status")
        self.clear_refs = Path(f"/proc/{pid}/clear_refs")

    def reset(self) -> None:
        self.clear_refs.write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)

    def _field_mb(self, name: str) -> float:
        match = re.search(rf"^{name}:\s+(\d+) kB", self.status.read_text(), re.MULTILINE)
        return int(match.group(1)) / 1024 if match else float("nan")

    def peak_mb(self) -> float:
        return self._field_mb("VmHWM")

    def rss_mb(self) -> float:
        return self._field_mb("VmRSS")


class HealthPoller:
    """``/health`` every 20 ms in a thread: (sent at, seconds to its answer)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.probes: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                start = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    client.get(f"{self.url}/health")
                self.probes.append((start, time.perf_counter() - start))
                time.sleep(0.02)

    def slowest_ms(self, start: float, end: float) -> float:
        during = [s for sent, s in self.probes if start <= sent + s and sent <= end]
        return max(during, default=0.0) * 1000


def _address(url: str) -> tuple[str, int]:
    parsed = httpx.URL(url)
    assert parsed.host and parsed.port
    return parsed.host, parsed.port


def _read_answer(conn: socket.socket, timeout: float) -> str:
    """The status and error code of what the server answered on ``conn``, or how the
    connection ended without one."""
    conn.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data or data.endswith(b"\r\n\r\n"):  # the head, then its body
            piece = conn.recv(65536)
            if not piece:
                break
            data += piece
            conn.settimeout(0.5)
    except (ConnectionResetError, BrokenPipeError):
        if not data:
            return "reset, no answer"
    except TimeoutError:
        if not data:
            return "no answer"
    match = _STATUS.match(data)
    if not match:
        return "closed, no answer" if not data else "not HTTP"
    answer = match.group(1).decode()
    _, _, body = data.partition(b"\r\n\r\n")
    try:
        error = json.loads(body).get("error", {})
        answer += f" {error.get('code') or error.get('param') or ''}".rstrip()
    except ValueError:
        pass
    return answer


def upload(url: str, head: bytes, size: int, chunked: bool) -> Outcome:
    """POST a body of ``size`` bytes after ``head`` (request line and headers, without
    the framing one), stopping as soon as the server answers or closes."""
    start = time.perf_counter()
    sent = 0
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % size
    chunk = b"x" * _CHUNK
    with socket.create_connection(_address(url)) as conn:
        conn.sendall(head + framing + b"\r\n\r\n")
        try:
            while sent < size:
                readable, _, _ = select.select([conn], [], [], 0)
                if readable:
                    break
                piece = chunk[: min(_CHUNK, size - sent)]
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            else:
                if chunked:
                    conn.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed under the sender: whatever it answered first is still there
        answer = _read_answer(conn, timeout=120)
    return Outcome(answer, time.perf_counter() - start, sent)


def _head(path: str, auth: bool) -> bytes:
    key = b"Authorization: Bearer " + KEY.encode() + b"\r\n" if auth else b""
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + key


def _request(method: str, url: str, **kwargs: Any) -> Outcome:
    start = time.perf_counter()
    try:
        response = httpx.request(method, url, timeout=300, **kwargs)
    except httpx.HTTPError as exc:
        return Outcome(type(exc).__name__, time.perf_counter() - start)
    answer = str(response.status_code)
    if response.status_code >= 400:
        try:
            error = response.json().get("error", {})
            answer += f" {error.get('code') or error.get('param') or ''}".rstrip()
        except ValueError:
            pass
    return Outcome(answer, time.perf_counter() - start)


def _together(outcomes: list[Outcome]) -> Outcome:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.answer] = counts.get(outcome.answer, 0) + 1
    answer = ", ".join(f"{n} x {a}" for a, n in sorted(counts.items()))
    sent = sum(o.sent or 0 for o in outcomes) if any(o.sent for o in outcomes) else None
    return Outcome(answer, max(o.seconds for o in outcomes), sent)


def _endless_header(url: str, limit_s: float = 10.0) -> Outcome:
    """One connection streaming one header line until the server stops it."""
    start = time.perf_counter()
    sent = 0
    with socket.create_connection(_address(url)) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
        try:
            while time.perf_counter() - start < limit_s:
                if select.select([conn], [], [], 0)[0]:
                    break
                conn.sendall(b"a" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_answer(conn, timeout=5)
    return Outcome(answer, time.perf_counter() - start, sent)


def _stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/cache/stats", headers=AUTH, timeout=30).json())


def _side_channel(url: str) -> Outcome:
    """A victim (salt A) sends a prompt; another tenant (salt B) sends the same guess:
    does ``prefix_hits`` move? (Then the victim's own again.)"""
    secret = "The launch code for project Nightingale is 7-4-1-9-9-2. " * 3
    body = {"prompt": secret, "max_tokens": 2, "temperature": 0}
    start = time.perf_counter()
    httpx.post(f"{url}/v1/completions", json={**body, "cache_salt": "victim"}, headers=AUTH,
               timeout=120)  # fmt: skip
    hits = [int(_stats(url).get("prefix_hits", 0))]
    for salt in ("attacker", None, "victim"):
        fields = {} if salt is None else {"cache_salt": salt}
        response = httpx.post(f"{url}/v1/completions", json={**body, **fields}, headers=AUTH,
                              timeout=120)  # fmt: skip
        if response.status_code != 200:
            return Outcome(f"{response.status_code} {response.text[:60]}",
                           time.perf_counter() - start)  # fmt: skip
        hits.append(int(_stats(url).get("prefix_hits", 0)))
    gains = [after - before for before, after in itertools.pairwise(hits)]
    answer = f"prefix_hits +{gains[0]} other salt, +{gains[1]} unsalted, +{gains[2]} own salt"
    return Outcome(answer, time.perf_counter() - start)


def _key_in_log(server: ServerProcess) -> Outcome:
    outcome = _request("GET", f"{server.url}/dashboard?api_key={KEY}")
    time.sleep(0.5)  # the access log line is written as the answer goes out
    logged = any(KEY in line for line in server.log)
    return Outcome(f"{outcome.answer}; key in the log: {'yes' if logged else 'no'}",
                   outcome.seconds)  # fmt: skip


def _strict_schema(url: str) -> Outcome:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"]}  # fmt: skip
    body = {
        "messages": [{"role": "user", "content": "Name a city and its country, as JSON."}],
        "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "city", "schema": schema, "strict": True}},
    }  # fmt: skip
    start = time.perf_counter()
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    if response.status_code != 200:
        return Outcome(str(response.status_code), time.perf_counter() - start)
    content = response.json()["choices"][0]["message"]["content"]
    return Outcome(f"200 {content}", time.perf_counter() - start)


def _docs_offline(url: str) -> Outcome:
    start = time.perf_counter()
    page = httpx.get(f"{url}/docs?api_key={KEY}", timeout=30)
    outside = sorted(set(re.findall(r"https?://[^\"'\s)]+", page.text)))
    answer = f"{page.status_code}; {len(outside)} outside URLs {' '.join(outside[:2])}".rstrip()
    return Outcome(answer, time.perf_counter() - start)


def _sigterm(server: ServerProcess) -> Outcome:
    """SIGTERM while a long stream runs; the seconds until the process has exited."""
    body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    started = threading.Event()

    def stream() -> None:
        try:
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH,
                              timeout=60) as response:  # fmt: skip
                for _ in response.iter_lines():
                    started.set()
        except httpx.HTTPError:
            pass

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    started.wait(60)
    start = time.perf_counter()
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(60)
    seconds = time.perf_counter() - start
    thread.join(5)
    return Outcome(f"exit {code}, --shutdown-timeout {SHUTDOWN_TIMEOUT_S:g}", seconds)


def attacks(
    server: ServerProcess, upload_mb: int, flood: int
) -> list[tuple[str, Callable[[], Outcome]]]:
    url = server.url
    size = upload_mb * MB
    completions = "/v1/completions"
    prompt_7mb = json.dumps({"prompt": "hello world " * 600_000}).encode()
    json_headers = {"content-type": "application/json"}

    def tokenize(auth: bool) -> Outcome:
        headers = {**json_headers, **(AUTH if auth else {})}
        return _request("POST", f"{url}/tokenize", content=prompt_7mb, headers=headers)

    def tokenize_flood_then_a_completion() -> Outcome:
        with ThreadPoolExecutor(flood) as pool:
            floods = [pool.submit(tokenize, True) for _ in range(flood)]
            time.sleep(0.5)
            innocent = _request("POST", f"{url}{completions}", headers=AUTH,
                                json={"prompt": "Hi", "max_tokens": 2})  # fmt: skip
            answered = _together([f.result() for f in floods])
        return Outcome(f"{answered.answer}; beside them a completion: {innocent.answer}",
                       answered.seconds)  # fmt: skip

    def concurrent_uploads() -> Outcome:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(upload, url, _head(completions, False), size // 2, True)
                       for _ in range(4)]  # fmt: skip
            return _together([f.result() for f in futures])

    return [
        (f"keyless chunked POST, {upload_mb} MB",
         lambda: upload(url, _head(completions, False), size, True)),
        (f"4 keyless chunked POSTs at once, {upload_mb // 2} MB each", concurrent_uploads),
        (f"keyed POST, Content-Length {upload_mb // 4} MB",
         lambda: upload(url, _head(completions, True), size // 4, False)),
        (f"keyed chunked POST, {upload_mb // 4} MB (limit 8 MB)",
         lambda: upload(url, _head(completions, True), size // 4, True)),
        ("keyless /tokenize, 7 MB prompt", lambda: tokenize(False)),
        ("keyless /detokenize", lambda: _request("POST", f"{url}/detokenize",
                                                 json={"tokens": [1, 2]})),
        ("keyless /v1/cache/stats", lambda: _request("GET", f"{url}/v1/cache/stats")),
        ("keyless /docs", lambda: _request("GET", f"{url}/docs")),
        ("keyed /tokenize, 7 MB prompt", lambda: tokenize(True)),
        (f"{flood} keyed /tokenize of 7 MB at once", tokenize_flood_then_a_completion),
        ("100 KB header", lambda: _request("GET", f"{url}/health",
                                           headers={"x-big": "a" * 100_000})),
        ("200 headers", lambda: _request("GET", f"{url}/health",
                                         headers={f"x-{i}": "a" for i in range(200)})),
        ("one endless header line", lambda: _endless_header(url)),
        ("Host: attacker.example (DNS rebinding)",
         lambda: _request("GET", f"{url}/v1/models",
                          headers={**AUTH, "Host": "attacker.example"})),
        ("prefix cache: another tenant's guess", lambda: _side_channel(url)),
        ("dashboard with ?api_key=, access log", lambda: _key_in_log(server)),
        ("strict json_schema, 1 property", lambda: _strict_schema(url)),
        ("tool message without a call",
         lambda: _request("POST", f"{url}/v1/chat/completions", headers=AUTH, json={
             "max_tokens": 4, "messages": [{"role": "user", "content": "hi"},
                          {"role": "tool", "content": "21 C", "tool_call_id": "c1"}]})),
        ("/docs offline", lambda: _docs_offline(url)),
        ("SIGTERM during a stream", lambda: _sigterm(server)),
    ]  # fmt: skip


def _warm_up(url: str) -> None:
    """A fresh server's first completion and first grammar take seconds on a CPU: not an
    attack's."""
    httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=AUTH,
               timeout=300)  # fmt: skip
    _strict_schema(url)


def security(server: ServerProcess, args: Any) -> None:
    memory = ApiMemory(server.process.pid)
    _warm_up(server.url)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"API process at rest: {memory.rss_mb():.0f} MB; host load average {load} "
          f"({os.cpu_count()} CPUs)")  # fmt: skip
    print("| attack | answer | seconds | body sent | API peak | API 1 s after | slowest /health |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with HealthPoller(server.url) as health:
        for what, attack in attacks(server, args.upload_mb, args.flood):
            alive = server.process.poll() is None
            if alive:
                memory.reset()
            start = time.perf_counter()
            outcome = attack()
            end = time.perf_counter()
            peak = after = "-"
            if alive and server.process.poll() is None:
                peak = f"{memory.peak_mb():.0f} MB"
                time.sleep(1.0)
                after = f"{memory.rss_mb():.0f} MB"
            sent = "-" if outcome.sent is None else f"{outcome.sent / MB:.0f} MB"
            print(f"| {what} | {outcome.answer} | {outcome.seconds:.2f} | {sent} | {peak} | "
                  f"{after} | {health.slowest_ms(start, end):.0f} ms |", flush=True)  # fmt: skip
