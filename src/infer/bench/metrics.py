"""Per-request latencies and the summary every benchmark reports.

Definitions (the same for the offline engine, the transformers peer and the HTTP client):

- TTFT: request arrival (when it was handed to the engine, or sent) → first output token.
  The offline driver hands requests over between steps, so a request that falls due while a
  step runs waits for that: ``ttft_from_due_ms`` counts from when it fell due.
- ITL: gap between consecutive output tokens of one request, pooled over all requests.
- E2E: arrival → last output token.
- Throughput: output tokens (and finished requests) ÷ the run's duration, from the first
  arrival to the last token of any request.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)
CDF_POINTS = 101  # quantiles kept in results so CDFs can be redrawn from the JSON


@dataclass
class RequestMetrics:
    """Timings of one request; times are seconds. ``token_times_s`` are relative to the
    request's arrival, ``arrival_s`` relative to the start of the run."""

    prompt_tokens: int
    arrival_s: float
    token_times_s: list[float] = field(default_factory=list)
    error: str | None = None
    due_wait_s: float = 0.0  # from falling due to arrival (the driver's look between steps)

    @property
    def output_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times_s)

    @property
    def ttft_s(self) -> float:
        return self.token_times_s[0]

    @property
    def e2e_s(self) -> float:
        return self.token_times_s[-1]

    @property
    def itl_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def finish_s(self) -> float:
        """When the last token came, relative to the start of the run."""
        return self.arrival_s + self.e2e_s


@dataclass
class RunResult:
    """What one engine did with one workload (plus engine-specific numbers in ``extra``)."""

    requests: list[RequestMetrics]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        """First arrival → last token (0 when nothing finished)."""
        done = [r for r in self.requests if r.ok]
        if not done:
            return 0.0
        return max(r.finish_s for r in done) - min(r.arrival_s for r in self.requests)


def append_token_times(times: list[float], now: float, count: int) -> None:
    """``count`` tokens that arrived together at ``now``, spread over the gap before them
    (a streamed chunk or an engine step that carries several tokens)."""
    if count <= 0:
        return
    previous = times[-1] if times else now
    step = (now - previous) / count
    times.extend(now - step * (count - 1 - i) for i in range(count))


def percentiles(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """``{"p50", "p90", "p99", "mean"}`` of ``values * scale`` (linear interpolation between
    order statistics); ``None`` for an empty list."""
    if not values:
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None}
    array = np.asarray(values, dtype=np.float64) * scale
    result: dict[str, float | None] = {
        f"p{p}": _round(float(np.percentile(array, p))) for p in PERCENTILES
    }
    result["mean"] = _round(float(array.mean()))
    return result


def cdf_quantiles(values: Sequence[float], scale: float = 1.0) -> list[float]:
    """Quantiles 0, 1, ..., 100 % of ``values * scale`` (an empirical CDF, compactly)."""
    if not values:
        return []
    array = np.asarray(values, dtype=np.float64) * scale
    return [_round(float(q)) for q in np.quantile(array, np.linspace(0.0, 1.0, CDF_POINTS))]


def throughput_timeline(result: RunResult, bins: int = 60) -> dict[str, Any]:
    """Output tokens per second in ``bins`` equal slices of the run."""
    start = min((r.arrival_s for r in result.requests), default=0.0)
    times = [r.arrival_s + t - start for r in result.requests if r.ok for t in r.token_times_s]
    duration = result.duration_s
    if not times or duration <= 0:
        return {"bin_s": 0.0, "output_tok_s": []}
    counts, _ = np.histogram(times, bins=bins, range=(0.0, duration))
    bin_s = duration / bins
    return {"bin_s": bin_s, "output_tok_s": [_round(c / bin_s) for c in counts]}


def summarize(result: RunResult, groups: Sequence[str] = ()) -> dict[str, Any]:
    """The summary dict (keys named in the benchmark issue) of a run. ``groups``: each
    request's group in a mixed workload (``Workload.groups``, in the requests' order); each
    named one also gets its own latencies under ``groups`` (e.g. the P99 ITL of the short
    requests beside long prompts)."""
    done = [r for r in result.requests if r.ok]
    duration = result.duration_s
    output_tokens = sum(r.output_tokens for r in done)
    ttft = [r.ttft_s for r in done]
    itl = [gap for r in done for gap in r.itl_s]
    e2e = [r.e2e_s for r in done]
    errors = sorted({r.error for r in result.requests if r.error})
    return {
        "num_requests": len(result.requests),
        "num_failed": len(result.requests) - len(done),
        "errors": errors[:5],
        "duration_s": _round(duration),
        "output_tokens": output_tokens,
        "prompt_tokens": sum(r.prompt_tokens for r in done),
        "output_tok_s": _round(output_tokens / duration) if duration > 0 else 0.0,
        "requests_per_s": _round(len(done) / duration) if duration > 0 else 0.0,
        **_latencies(done),
        "ttft_from_due_ms": percentiles([r.due_wait_s + r.ttft_s for r in done], 1e3),
        **result.extra,
        **_group_latencies(result, groups),
        "cdf": {
            "ttft_ms": cdf_quantiles(ttft, 1e3),
            "itl_ms": cdf_quantiles(itl, 1e3),
            "e2e_ms": cdf_quantiles(e2e, 1e3),
        },
        "timeline": throughput_timeline(result),
        "requests": [
            {
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "arrival_s": _round(r.arrival_s),
                "ttft_ms": _round(r.ttft_s * 1e3) if r.ok else None,
                "e2e_ms": _round(r.e2e_s * 1e3) if r.ok else None,
                "error": r.error,
            }
            for r in result.requests
        ],
    }


def _latencies(done: list[RequestMetrics]) -> dict[str, dict[str, float | None]]:
    """TTFT, ITL (pooled over the requests) and E2E percentiles, in milliseconds."""
    return {
        "ttft_ms": percentiles([r.ttft_s for r in done], 1e3),
        "itl_ms": percentiles([gap for r in done for gap in r.itl_s], 1e3),
        "e2e_ms": percentiles([r.e2e_s for r in done], 1e3),
    }


def _group_latencies(result: RunResult, groups: Sequence[str]) -> dict[str, Any]:
    if not any(groups):
        return {}
    members: dict[str, list[RequestMetrics]] = {}
    for request, group in zip(result.requests, groups, strict=True):
        if group and request.ok:
            members.setdefault(group, []).append(request)
    return {
        "groups": {
            group: {"num_requests": len(requests), **_latencies(requests)}
            for group, requests in members.items()
        }
    }


def _round(value: float) -> float:
    return round(value, 3)
