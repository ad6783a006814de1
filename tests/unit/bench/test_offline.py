"""The offline runners on a tiny random model on the CPU: infer's engine and transformers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from infer.bench.hf_peer import build_hf_model, run_hf
from infer.bench.metrics import summarize
from infer.bench.offline import check_fits, run_infer
from infer.config import EngineConfig
from infer.engine.core.engine import Engine
from infer.workloads import RequestSpec, Workload, make_workload

VOCAB = 320  # the tiny checkpoints'


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Callable[[str], Path]) -> Iterator[Engine]:
    yield Engine(
        EngineConfig(
            model=str(tiny_checkpoint("llama")),
            device="cpu",
            num_gpu_blocks=128,
            max_seq_len=512,
            max_batch_size=8,
        )
    )


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint: Callable[[str], Path]) -> Any:
    return build_hf_model(
        str(tiny_checkpoint("llama")), "auto", torch.device("cpu"), torch.float32, seed=0
    )


def _staggered() -> Workload:
    return Workload("staggered", "", [RequestSpec([40 + i] * 20, 6, i * 0.15) for i in range(3)])


def test_infer_adds_requests_at_their_arrival_times(engine: Engine) -> None:
    result = run_infer(engine, _staggered(), progress=False)
    for request, spec in zip(result.requests, _staggered().requests, strict=True):
        assert request.ok and request.output_tokens == spec.max_tokens
        assert spec.arrival_s <= request.arrival_s  # added when due, between steps
        assert request.due_wait_s == pytest.approx(request.arrival_s - spec.arrival_s)
        assert request.token_times_s == sorted(request.token_times_s)
    assert 0.0 < result.extra["peak_kv_utilization"] <= 1.0
    assert result.extra["preemptions"] == 0
    assert summarize(result)["duration_s"] >= 0.3


def test_infer_sequential_runs_one_at_a_time(engine: Engine) -> None:
    workload = make_workload("single", VOCAB, num_requests=2).capped(5)
    warmup = make_workload("single", VOCAB, num_requests=1, seed=1).capped(2)
    first, second = run_infer(engine, workload, warmup, progress=False).requests
    assert first.output_tokens == second.output_tokens == 5
    assert second.arrival_s >= first.finish_s
    assert first.due_wait_s == second.due_wait_s == 0.0  # due when the one before finished


def test_infer_counts_preemptions_of_the_measured_run(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    # 6 blocks of 16 positions cannot hold two 50-token sequences: one is preempted.
    small = Engine(
        EngineConfig(
            model=str(tiny_checkpoint("llama")),
            device="cpu",
            num_gpu_blocks=6,
            max_seq_len=64,
            max_batch_size=4,
            use_prefix_caching=False,
            admission_reserve=0.0,
        )
    )
    workload = Workload("tight", "", [RequestSpec([50] * 20, 30), RequestSpec([60] * 20, 30)])
    result = run_infer(small, workload, progress=False)
    assert [r.output_tokens for r in result.requests] == [30, 30]
    assert result.extra["preemptions"] >= 1
    assert result.extra["peak_kv_utilization"] == 1.0


def test_workloads_longer_than_the_context_are_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match=r"max_seq_len: workload single needs .* 640"):
        check_fits(make_workload("single", VOCAB), engine.max_seq_len)


def test_transformers_generate_for_sequential_workloads(hf_model: Any) -> None:
    workload = make_workload("single", VOCAB, num_requests=2).capped(4)
    result = run_hf(
        hf_model, workload, make_workload("single", VOCAB, 1, seed=1).capped(2), progress=False
    )
    assert [r.output_tokens for r in result.requests] == [4, 4]
    assert result.requests[1].arrival_s >= result.requests[0].finish_s
    assert result.extra["hf_api"] == "generate"


@pytest.mark.filterwarnings(r"ignore:The `paged\|` prefix is no longer needed")
@pytest.mark.serial
def test_transformers_continuous_batching_with_arrivals(hf_model: Any) -> None:
    result = run_hf(hf_model, _staggered(), progress=False)
    for request, spec in zip(result.requests, _staggered().requests, strict=True):
        assert request.ok and request.output_tokens == spec.max_tokens
        assert spec.arrival_s <= request.arrival_s < spec.arrival_s + 0.25
        assert 0.0 < request.ttft_s <= request.e2e_s
    assert result.extra["hf_attention"].endswith("sdpa")  # "paged|" is implied from 5.23
