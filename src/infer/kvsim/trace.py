"""Request traces: built-in workloads, the benchmark's workloads, and JSONL trace files.

A trace is a list of requests, each with an arrival time, a prompt length, an output length
and, optionally, a prefix shared with other requests (``prefix_id``: requests with the same
id begin with the same ``prefix_tokens`` tokens, a common system prompt). Only lengths
matter to the cache, so token ids are made up where a workload has none: every prompt and
output token is distinct except the shared prefixes, which is what prefix caching exploits.

Workloads of the simulator (default request counts in brackets; ``U[a,b]`` = uniform
integers):

- ``lab`` [16]: Lab 0.3's sequences, U[100,500] tokens, all at t=0. The lab fills each
  cache and then measures it, so the whole length is prompt and one token is generated.
- ``shared-prefix`` [32]: a common 256-token system prompt + U[16,128] user tokens,
  output U[64,128], Poisson arrivals at 16/s.
- ``churn`` [200]: sizes that vary widely arriving and leaving continuously (Poisson 20/s;
  70% prompts U[16,128], 30% U[512,1024]; output U[16,512]); it fragments a contiguous
  allocator.

The seeds' benchmark workloads (``baseline``, ``continuous_batching``, ``paged_attention``,
``chunked_prefill``, ``prefix_caching``, ``burst256``, ``single``) are the benchmark's own
(``infer.workloads``), prompt token ids included, so shared prefixes are shared here
exactly as in the engine; sequential ones (``baseline``, ``single``) send each request when
the previous one has finished.

JSONL traces: one object per line with ``arrival_s``, ``prompt_tokens``, ``output_tokens``
and optionally ``prefix_id`` and ``prefix_tokens`` (default: the shortest prompt among the
requests that share the id).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from infer.workloads import WORKLOADS as BENCH_WORKLOADS
from infer.workloads import make_workload


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace (lengths in tokens)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_id: str | None = None
    prefix_tokens: int = 0  # leading prompt tokens shared by every request with prefix_id
    token_ids: tuple[int, ...] = ()  # the prompt itself, where the workload has one


@dataclass(frozen=True)
class Trace:
    """A workload's requests; ``sequential``: each one arrives when the previous one has
    finished (arrival times unused)."""

    name: str
    requests: list[TraceRequest]
    sequential: bool = False


def _poisson_times(n: int, rate: float, rng: random.Random) -> Iterator[float]:
    clock = 0.0
    for _ in range(n):
        yield clock
        clock += rng.expovariate(rate)


def _lab(n: int, rng: random.Random) -> list[TraceRequest]:
    return [TraceRequest(0.0, rng.randint(100, 500), 1) for _ in range(n)]


def _shared_prefix(n: int, rng: random.Random) -> list[TraceRequest]:
    return [
        TraceRequest(t, 256 + rng.randint(16, 128), rng.randint(64, 128), "system", 256)
        for t in _poisson_times(n, 16.0, rng)
    ]


def _churn(n: int, rng: random.Random) -> list[TraceRequest]:
    return [
        TraceRequest(
            t,
            rng.randint(16, 128) if rng.random() < 0.7 else rng.randint(512, 1024),
            rng.randint(16, 512),
        )
        for t in _poisson_times(n, 20.0, rng)
    ]


# name → (default number of requests, description, generator)
WORKLOADS: dict[str, tuple[int, str, Callable[[int, random.Random], list[TraceRequest]]]] = {
    "lab": (16, "Lab 0.3's sequences: 100-500 prompt tokens at t=0, 1 generated", _lab),
    "shared-prefix": (
        32,
        "Poisson 16/s, a common 256-token system prompt + 16-128 own tokens, output 64-128",
        _shared_prefix,
    ),
    "churn": (
        200,
        "Poisson 20/s, prompts 16-128 (70%) or 512-1024 (30%), outputs 16-512",
        _churn,
    ),
}
# Prompt ids of the benchmark's workloads are drawn below this vocabulary size; any size
# does, since only equal and unequal ids matter to the cache.
_BENCH_VOCAB = 32_000


def describe_workloads() -> dict[str, str]:
    """Every workload name and what it is (``[count]`` = default number of requests)."""
    return {
        **{name: f"[{count}] {text}" for name, (count, text, _) in WORKLOADS.items()},
        **{
            name: f"[{w.default_num_requests}] {w.description}"
            for name, w in BENCH_WORKLOADS.items()
        },
    }


def make_trace(workload: str, num_requests: int | None = None, seed: int = 0) -> Trace:
    """The requests of a built-in or benchmark workload (``num_requests`` overrides its
    count) or of a JSONL trace file (its first ``num_requests``), in arrival order."""
    if num_requests is not None and num_requests < 1:
        raise ValueError(f"num_requests: must be >= 1, got {num_requests}")
    if workload in WORKLOADS:
        default, _, generate = WORKLOADS[workload]
        return Trace(workload, _sorted(generate(num_requests or default, random.Random(seed))))
    if workload in BENCH_WORKLOADS:
        bench = make_workload(workload, _BENCH_VOCAB, num_requests, seed)
        requests = [
            TraceRequest(
                r.arrival_s,
                len(r.prompt_token_ids),
                r.max_tokens,
                token_ids=tuple(r.prompt_token_ids),
            )
            for r in bench.requests
        ]
        return Trace(
            workload, requests if bench.sequential else _sorted(requests), bench.sequential
        )
    if Path(workload).is_file():
        return Trace(workload, _sorted(load_jsonl(Path(workload))[:num_requests]))
    raise ValueError(
        f"workload: {workload!r} is neither a built-in workload "
        f"({', '.join(describe_workloads())}) "
        "nor an existing JSONL trace file"
    )


def _sorted(requests: list[TraceRequest]) -> list[TraceRequest]:
    return sorted(requests, key=lambda r: r.arrival_s)


_REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
_FIELDS = (*_REQUIRED, "prefix_id", "prefix_tokens")


def load_jsonl(path: Path) -> list[TraceRequest]:
    """Requests of a JSONL trace; ``ValueError`` naming the line and field of bad input."""
    trace: list[TraceRequest] = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                trace.append(_parse_line(line, f"{path}:{number}"))
    if not trace:
        raise ValueError(f"workload: {path} holds no requests")
    return _default_prefix_lengths(trace)


def _parse_line(line: str, where: str) -> TraceRequest:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: each line must be a JSON object")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: {unknown[0]}: unknown field (fields: {', '.join(_FIELDS)})")
    for name in _REQUIRED:
        if name not in raw:
            raise ValueError(f"{where}: {name}: missing")
    arrival = raw["arrival_s"]
    if isinstance(arrival, bool) or not isinstance(arrival, int | float) or arrival < 0:
        raise ValueError(f"{where}: arrival_s: must be a number >= 0, got {arrival!r}")
    prompt = _count(raw, "prompt_tokens", where, minimum=1)
    output = _count(raw, "output_tokens", where, minimum=1)
    prefix_id = raw.get("prefix_id")
    if prefix_id is not None and not isinstance(prefix_id, str):
        raise ValueError(f"{where}: prefix_id: must be a string, got {prefix_id!r}")
    prefix_tokens = _count(raw, "prefix_tokens", where, minimum=1) if "prefix_tokens" in raw else 0
    if prefix_tokens and prefix_id is None:
        raise ValueError(f"{where}: prefix_tokens: needs a prefix_id")
    if prefix_tokens > prompt:
        raise ValueError(f"{where}: prefix_tokens: {prefix_tokens} exceeds prompt_tokens {prompt}")
    return TraceRequest(float(arrival), prompt, output, prefix_id, prefix_tokens)


def _count(raw: dict[str, object], name: str, where: str, minimum: int) -> int:
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: {name}: must be an integer >= {minimum}, got {value!r}")
    return value


def _default_prefix_lengths(trace: list[TraceRequest]) -> list[TraceRequest]:
    """Give requests with a ``prefix_id`` but no ``prefix_tokens`` the group's shortest prompt."""
    shortest: dict[str, int] = {}
    for request in trace:
        if request.prefix_id is not None:
            length = request.prefix_tokens or request.prompt_tokens
            shortest[request.prefix_id] = min(shortest.get(request.prefix_id, length), length)
    return [
        replace(r, prefix_tokens=shortest[r.prefix_id])
        if r.prefix_id is not None and not r.prefix_tokens
        else r
        for r in trace
    ]


class TokenIds:
    """Made-up token ids: distinct everywhere except the shared prefix of a ``prefix_id``
    (and above any vocabulary, so they never equal a workload's real prompt ids)."""

    def __init__(self) -> None:
        self._next = itertools.count(2**32)
        self._prefixes: dict[str, list[int]] = {}

    def fresh(self, count: int) -> list[int]:
        return [next(self._next) for _ in range(count)]

    def prompt(self, request: TraceRequest) -> list[int]:
        if request.token_ids:
            return list(request.token_ids)
        if request.prefix_id is None:
            return self.fresh(request.prompt_tokens)
        prefix = self._prefixes.setdefault(request.prefix_id, [])
        if len(prefix) < request.prefix_tokens:  # a longer version of the shared prefix
            prefix += self.fresh(request.prefix_tokens - len(prefix))
        return prefix[: request.prefix_tokens] + self.fresh(
            request.prompt_tokens - request.prefix_tokens
        )
