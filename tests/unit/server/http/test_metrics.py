import itertools

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram

from infer.engine.process import EngineSnapshot
from infer.server.http.metrics import ServerMetrics, observe_all

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def _histogram() -> tuple[Histogram, CollectorRegistry]:
    registry = CollectorRegistry()
    return Histogram("latency_seconds", "test", buckets=BUCKETS, registry=registry), registry


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    """Every bucket, count and sum (not the creation time, which differs per histogram)."""
    return {
        f"{s.name}{s.labels}": s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_observe_all_fills_buckets_as_observing_each_value_does() -> None:
    # on a bound, between bounds, above the last one (+Inf), zero, repeated values
    values = [0.0, 0.001, 0.0011, 0.01, 0.05, 0.05, 0.1, 0.99, 1.0, 1.5, 80.0]
    one_by_one, expected = _histogram()
    for value in values:
        one_by_one.observe(value)
    at_once, actual = _histogram()
    observe_all(at_once, np.array(values))
    assert _samples(actual) == pytest.approx(_samples(expected))


def test_observe_all_adds_to_what_was_observed_before() -> None:
    one_by_one, expected = _histogram()
    at_once, actual = _histogram()
    for batch in ([0.5, 0.002], [], [3.0, 0.0005, 0.5]):
        for value in batch:
            one_by_one.observe(value)
        observe_all(at_once, np.array(batch, dtype=float))
    assert _samples(actual) == pytest.approx(_samples(expected))


class _FinishedJob:
    """What ``ServerMetrics.observe`` reads of a closed ``Job``."""

    def __init__(self, submitted: float, token_times: list[list[float]], reasons: list[str]):
        self.submitted = submitted
        self.token_times = token_times
        self.finish_reasons = reasons


def test_a_job_records_each_sequences_first_token_gaps_and_end() -> None:
    metrics = ServerMetrics(EngineSnapshot)
    times = [[1.0, 1.01, 1.03, 1.06], [2.0, 2.5]]
    metrics.observe(_FinishedJob(0.5, times, ["length", "stop"]))

    def sample(name: str) -> float:
        value = metrics.registry.get_sample_value(name)
        assert value is not None
        return value

    gaps = [b - a for seq in times for a, b in itertools.pairwise(seq)]
    assert sample("infer_inter_token_latency_seconds_count") == len(gaps) == 4
    assert abs(sample("infer_inter_token_latency_seconds_sum") - sum(gaps)) < 1e-9
    assert sample("infer_time_to_first_token_seconds_count") == 2
    assert abs(sample("infer_time_to_first_token_seconds_sum") - (0.5 + 1.5)) < 1e-9
    assert abs(sample("infer_e2e_request_latency_seconds_sum") - (0.56 + 2.0)) < 1e-9
    finished = metrics.registry.get_sample_value
    assert finished("infer_request_finished_total", {"finish_reason": "length"}) == 1
    assert finished("infer_request_finished_total", {"finish_reason": "stop"}) == 1


def test_the_engines_counters_come_from_its_latest_snapshot() -> None:
    snapshot = EngineSnapshot(preemptions=2, generation_tokens=40, structured_output_errors=1)
    metrics = ServerMetrics(lambda: snapshot)
    value = metrics.registry.get_sample_value
    assert value("infer_num_preemptions_total") == 2
    assert value("infer_generation_tokens_total") == 40
    assert value("infer_structured_output_errors_total") == 1


def test_speculation_counters_match_vllms_spec_decode_metrics() -> None:
    """Proposals, acceptances, the rate and acceptance by position among a row's proposals."""
    from infer.contract.speculation_stats import SpeculationStats

    stats = SpeculationStats()
    stats.record(4, 3)
    stats.record(4, 1)
    stats.record(2, 0)
    metrics = ServerMetrics(lambda: EngineSnapshot(speculation=stats))
    samples = _samples(metrics.registry)
    assert samples["infer_spec_decode_num_drafts_total{}"] == 3
    assert samples["infer_spec_decode_num_draft_tokens_total{}"] == 10
    assert samples["infer_spec_decode_num_accepted_tokens_total{}"] == 4
    assert samples["infer_spec_decode_acceptance_rate{}"] == pytest.approx(0.4)
    per_position = "infer_spec_decode_num_accepted_tokens_per_pos_total"
    assert [samples[f"{per_position}{{'position': '{i}'}}"] for i in range(3)] == [2, 1, 1]
