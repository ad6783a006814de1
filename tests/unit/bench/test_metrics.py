"""Metrics: known timings in, known percentiles, rates and distributions out."""

from __future__ import annotations

import pytest

from infer.bench.metrics import (
    CDF_POINTS,
    RequestMetrics,
    RunResult,
    cdf_quantiles,
    percentiles,
    summarize,
    throughput_timeline,
)


def test_percentiles_interpolate_between_order_statistics() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == {"p50": 50.5, "p90": 90.1, "p99": 99.01, "mean": 50.5}
    assert percentiles([0.002, 0.004], scale=1e3) == {
        "p50": 3.0,
        "p90": 3.8,
        "p99": 3.98,
        "mean": 3.0,
    }
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_request_latencies_from_token_times() -> None:
    request = RequestMetrics(prompt_tokens=10, arrival_s=1.0, token_times_s=[0.5, 0.6, 0.8])
    assert request.ok and request.output_tokens == 3
    assert request.ttft_s == 0.5
    assert request.itl_s == pytest.approx([0.1, 0.2])
    assert request.e2e_s == 0.8
    assert request.finish_s == pytest.approx(1.8)


def _run() -> RunResult:
    return RunResult(
        [
            RequestMetrics(100, 0.0, [0.1, 0.2, 0.3, 0.4]),
            RequestMetrics(200, 1.0, [0.2, 0.5, 1.0]),
            RequestMetrics(300, 0.5, error="boom"),
        ],
        {"preemptions": 2},
    )


def test_summary_of_a_known_run() -> None:
    summary = summarize(_run())
    # Duration: first arrival (0.0) → last token (1.0 + 1.0 = 2.0).
    assert summary["duration_s"] == 2.0
    assert summary["num_requests"] == 3 and summary["num_failed"] == 1
    assert summary["errors"] == ["boom"]
    assert summary["output_tokens"] == 7 and summary["prompt_tokens"] == 300
    assert summary["output_tok_s"] == 3.5
    assert summary["requests_per_s"] == 1.0
    assert summary["ttft_ms"]["p50"] == pytest.approx(150.0)
    # ITLs pooled over requests: 100, 100, 100, 300, 500 ms.
    assert summary["itl_ms"]["p50"] == pytest.approx(100.0)
    assert summary["itl_ms"]["p90"] == pytest.approx(420.0)
    assert summary["itl_ms"]["mean"] == pytest.approx(220.0)
    assert summary["e2e_ms"]["p99"] == pytest.approx(994.0)
    assert summary["preemptions"] == 2
    assert [r["error"] for r in summary["requests"]] == [None, None, "boom"]
    assert summary["requests"][1]["ttft_ms"] == pytest.approx(200.0)


def test_named_groups_get_their_own_latencies() -> None:
    summary = summarize(_run(), groups=["short", "long", "short"])
    short, long = summary["groups"]["short"], summary["groups"]["long"]
    assert short["num_requests"] == 1  # the third request failed
    assert long["num_requests"] == 1
    assert short["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert long["itl_ms"]["p99"] == pytest.approx(498.0)  # between 300 and 500 ms
    assert "groups" not in summarize(_run())  # a workload without groups


def test_cdf_quantiles_span_min_to_max() -> None:
    quantiles = cdf_quantiles([3.0, 1.0, 2.0], scale=10.0)
    assert len(quantiles) == CDF_POINTS
    assert quantiles[0] == 10.0 and quantiles[50] == 20.0 and quantiles[-1] == 30.0
    assert quantiles == sorted(quantiles)
    assert cdf_quantiles([]) == []


def test_timeline_counts_every_token_once() -> None:
    run = _run()
    timeline = throughput_timeline(run, bins=4)
    assert timeline["bin_s"] == pytest.approx(0.5)
    # Absolute token times: 0.1 0.2 0.3 0.4 | 1.2 1.5 2.0 → bins [0,.5) [.5,1) [1,1.5) [1.5,2].
    assert timeline["output_tok_s"] == pytest.approx([8.0, 0.0, 2.0, 4.0])


def test_nothing_finished() -> None:
    summary = summarize(RunResult([RequestMetrics(5, 0.0, error="refused")]))
    assert summary["output_tok_s"] == 0.0 and summary["duration_s"] == 0.0
    assert summary["ttft_ms"]["p50"] is None
    assert summary["timeline"] == {"bin_s": 0.0, "output_tok_s": []}
