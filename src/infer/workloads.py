"""Workloads of the benchmarks and of the KV-cache simulator: the seeds' five serving
patterns plus ``burst256``, ``serve_burst`` and ``single``.

A workload is a list of requests (random token-id prompts, a fixed output length, an arrival
offset) generated from a seed, so every run of the same name, size and seed sends exactly the
same requests. Prompts are token ids, not text, so dummy-weight models without a tokenizer
work and prompt lengths are exact. Outputs run to ``max_tokens`` (EOS is ignored).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

SHARED_PREFIX_TOKENS = 1024


@dataclass(frozen=True)
class RequestSpec:
    """One request: what to send and when (seconds after the run starts). ``group`` names
    its part of a mixed workload, whose figures are also summarised apart."""

    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float = 0.0
    group: str = ""


@dataclass(frozen=True)
class Workload:
    """The requests of one run. ``sequential``: each request is sent when the previous one
    has finished (batch 1), and arrival offsets are not used."""

    name: str
    description: str
    requests: list[RequestSpec]
    sequential: bool = False

    @property
    def max_sequence_len(self) -> int:
        """Longest prompt + output of any request (what ``max_seq_len`` must allow)."""
        return max(len(r.prompt_token_ids) + r.max_tokens for r in self.requests)

    @property
    def groups(self) -> list[str]:
        """Each request's group (``RequestSpec.group``), in the requests' order."""
        return [r.group for r in self.requests]

    @property
    def total_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    @property
    def is_burst(self) -> bool:
        """All requests arrive at once (what ``generate_batch``-style APIs can run)."""
        return not self.sequential and all(r.arrival_s == 0.0 for r in self.requests)

    def capped(self, max_tokens: int) -> Workload:
        """The same requests with outputs cut to ``max_tokens`` (quick runs, warm-up)."""
        return replace(
            self,
            requests=[replace(r, max_tokens=min(r.max_tokens, max_tokens)) for r in self.requests],
        )


class _Prompts:
    """Random prompt token ids from a range that avoids special tokens at either vocab end.

    Special and control tokens sit at the start (Gemma 3) or the end (Llama 3, Qwen3) of the
    vocabulary, so ids come from [min(1000, V/10), min(20000, V)), as the transformers peer
    measurement did for large vocabularies.
    """

    def __init__(self, vocab_size: int, rng: random.Random) -> None:
        if vocab_size < 16:
            raise ValueError(f"vocab_size: must be >= 16, got {vocab_size}")
        self.low = min(1000, vocab_size // 10)
        self.high = min(20000, vocab_size)
        self.rng = rng

    def __call__(self, length: int) -> list[int]:
        return [self.rng.randrange(self.low, self.high) for _ in range(length)]


def _uniform_arrivals(n: int, rate_per_s: float) -> list[float]:
    return [i / rate_per_s for i in range(n)]


def _poisson_arrivals(n: int, rate_per_s: float, rng: random.Random) -> list[float]:
    arrivals, t = [], 0.0
    for _ in range(n):
        arrivals.append(t)
        t += rng.expovariate(rate_per_s)
    return arrivals


def _baseline(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    return [RequestSpec(prompts(256), 256) for _ in range(n)]


def _continuous_batching(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    return [
        RequestSpec(prompts(rng.randint(64, 512)), rng.randint(64, 256), arrival)
        for arrival in _uniform_arrivals(n, rate_per_s=4.0)
    ]


def _paged_attention(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    return [RequestSpec(prompts(rng.randint(128, 384)), rng.randint(128, 256)) for _ in range(n)]


def _chunked_prefill(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    specs = []
    for arrival in _poisson_arrivals(n, rate_per_s=6.0, rng=rng):
        length = rng.randint(1024, 2048) if rng.random() < 0.75 else rng.randint(64, 128)
        specs.append(RequestSpec(prompts(length), rng.randint(64, 256), arrival))
    return specs


def _prefix_caching(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    prefix = prompts(SHARED_PREFIX_TOKENS)
    return [
        RequestSpec(prefix + prompts(rng.randint(32, 128)), 256, arrival)
        for arrival in _uniform_arrivals(n, rate_per_s=8.0)
    ]


def _burst256(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    return [RequestSpec(prompts(rng.randint(128, 384)), 256) for _ in range(n)]


def _serve_burst(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    return [RequestSpec(prompts(rng.randint(128, 384)), rng.randint(128, 384)) for _ in range(n)]


def _single(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    return [RequestSpec(prompts(128), 512) for _ in range(n)]


# Lone long prompts (time to first token): 8k, 32k and just under 128k tokens.
LONG_PROMPT_LENGTHS = (8192, 32768, 131072 - 64)


def _long_prompt(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    lengths = [LONG_PROMPT_LENGTHS[i % len(LONG_PROMPT_LENGTHS)] for i in range(n)]
    return [RequestSpec(prompts(length), 16) for length in lengths]


def _long_decode(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    return [RequestSpec(prompts(32768), 256) for _ in range(n)]


def _long_mix(n: int, rng: random.Random, prompts: _Prompts) -> list[RequestSpec]:
    """``n`` short requests decoding from the start, and one 16k-token prompt a second
    (a quarter as many) arriving among them from the second second on."""
    short = [RequestSpec(prompts(128), 1024, group="short") for _ in range(n)]
    arrivals = _uniform_arrivals(max(1, n // 4), rate_per_s=1.0)
    return short + [RequestSpec(prompts(16384), 64, 2.0 + t, "long") for t in arrivals]


@dataclass(frozen=True)
class WorkloadDef:
    description: str
    default_num_requests: int
    generate: Callable[[int, random.Random, _Prompts], list[RequestSpec]]
    sequential: bool = False


WORKLOADS: dict[str, WorkloadDef] = {
    "baseline": WorkloadDef(
        "sequential requests, prompt 256, output 256 (overhead floor)", 10, _baseline, True
    ),
    "continuous_batching": WorkloadDef(
        "uniform arrivals at 4 req/s, prompts 64-512, outputs 64-256", 32, _continuous_batching
    ),
    "paged_attention": WorkloadDef(
        "one burst, prompts 128-384, outputs 128-256", 48, _paged_attention
    ),
    "chunked_prefill": WorkloadDef(
        "Poisson arrivals at 6 req/s; 75% long prompts 1024-2048, the rest 64-128; outputs 64-256",
        48,
        _chunked_prefill,
    ),
    "prefix_caching": WorkloadDef(
        f"uniform arrivals at 8 req/s, a shared {SHARED_PREFIX_TOKENS}-token prefix + 32-128 "
        "own tokens, output 256",
        48,
        _prefix_caching,
    ),
    "burst256": WorkloadDef("256 requests at once, prompts 128-384, output 256", 256, _burst256),
    "serve_burst": WorkloadDef(
        "256 requests at once, prompts 128-384, outputs 128-384: the burst the serving "
        "benchmark sends (bench_serving_vs_vllm.py), offline, the server's like-for-like peer",
        256,
        _serve_burst,
    ),
    "single": WorkloadDef("batch 1: prompt 128, output 512", 1, _single, True),
    "long_prompt": WorkloadDef(
        "lone long prompts, one after another: 8k, 32k and ~128k tokens (repeating), output 16",
        3,
        _long_prompt,
        True,
    ),
    "long_decode": WorkloadDef(
        "16 requests at once with 32k-token prompts, output 256 (--num-requests 1: batch 1)",
        16,
        _long_decode,
    ),
    "long_mix": WorkloadDef(
        "32 short requests (prompt 128, output 1,024) decoding while 16k-token prompts arrive "
        "at 1 req/s from t = 2 s (8 of them), output 64",
        32,
        _long_mix,
    ),
}


def make_workload(
    name: str, vocab_size: int, num_requests: int | None = None, seed: int = 0
) -> Workload:
    """Generate workload ``name`` (``num_requests`` scales it; same seed → same requests)."""
    if name not in WORKLOADS:
        raise ValueError(f"workload: unknown {name!r}; choose from {', '.join(WORKLOADS)}")
    spec = WORKLOADS[name]
    n = spec.default_num_requests if num_requests is None else num_requests
    if n < 1:
        raise ValueError(f"num_requests: must be >= 1, got {n}")
    rng = random.Random(f"{name}:{seed}")
    return Workload(
        name, spec.description, spec.generate(n, rng, _Prompts(vocab_size, rng)), spec.sequential
    )


def parse_workload_names(value: str) -> list[str]:
    """``"burst256,single"`` → the names, each checked."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise ValueError("workload: give at least one name")
    for name in names:
        if name not in WORKLOADS:
            raise ValueError(f"workload: unknown {name!r}; choose from {', '.join(WORKLOADS)}")
    return names
