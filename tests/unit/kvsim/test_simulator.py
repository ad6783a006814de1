"""The simulator's step model, checked against the real engine running a tiny model."""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infer.config import EngineConfig
from infer.contract.sampling_params import SamplingParams
from infer.engine.core.engine import Engine
from infer.engine.core.step import Step
from infer.kvsim.footprint import footprint_of_config, load_footprint
from infer.kvsim.simulator import Arrivals, simulate
from infer.kvsim.trace import Trace, TraceRequest, make_trace

STEP_S = 0.02


def _engine_trace(vocab: int) -> Trace:
    """Staggered requests crossing block boundaries, enough to preempt in 40 blocks, an
    idle gap, and two families of prompts sharing 32- and 20-token prefixes."""
    rng = random.Random(7)
    prefixes = [[rng.randrange(3, vocab) for _ in range(n)] for n in (32, 20)]
    requests = []
    for i in range(18):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 90))]
        if i % 3:
            prompt = prefixes[i % 2] + prompt
        requests.append(
            TraceRequest(0.03 * i, len(prompt), rng.randint(4, 50), token_ids=tuple(prompt))
        )
    requests.append(TraceRequest(4.0, 20, 10, token_ids=tuple(range(3, 23))))  # after a gap
    return Trace("engine", requests)


def _engine_utilization(engine: Engine, trace: Trace) -> list[float]:
    """Drive the engine step by step on the simulator's clock; the utilisation each step
    runs with (as its scheduler hands it out, which is where the simulator samples)."""
    arrivals = Arrivals(trace, STEP_S)
    samples = []
    scheduler = engine.scheduler

    def sampled(schedule: Callable[..., Step]) -> Callable[..., Step]:
        def schedule_and_sample(*args: Any) -> Step:
            out = schedule(*args)
            if out is not None and out.chunks:
                samples.append(float(engine.cache_stats()["utilization"]))
            return out

        return schedule_and_sample

    scheduler.schedule = sampled(scheduler.schedule)  # type: ignore[method-assign]
    scheduler.schedule_ahead = sampled(scheduler.schedule_ahead)  # type: ignore[method-assign]
    while arrivals.pending() or engine.has_unfinished_requests():
        for spec in arrivals.due(engine.has_unfinished_requests()):
            params = SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True, temperature=0)
            engine.add_request(list(spec.token_ids), params)
        engine.step()
        arrivals.tick()
    return samples


@pytest.mark.parametrize(("strategy", "prefix_caching"), [("paged", False), ("paged+prefix", True)])
def test_paged_utilization_matches_the_engine(
    strategy: str, prefix_caching: bool, tiny_checkpoint: Callable[[str], Path]
) -> None:
    config = EngineConfig(
        model=str(tiny_checkpoint("llama")),
        device="cpu",
        dtype="float32",
        num_gpu_blocks=40,
        block_size=16,
        max_seq_len=256,
        max_batch_size=16,
        use_prefix_caching=prefix_caching,
        use_cuda_graphs=False,
        use_async_scheduling=False,  # the simulator models the synchronous step
    )
    engine = Engine(config)
    trace = _engine_trace(engine.model_config.vocab_size)
    expected = _engine_utilization(engine, trace)

    footprint = footprint_of_config("tiny", engine.model_config, "float32")
    memory = 40 * footprint.block_bytes(16)
    result = simulate(trace, strategy, footprint, memory, config, step_s=STEP_S)

    assert len(result.timeline.utilization) == len(expected)
    assert max(abs(a - b) for a, b in zip(result.timeline.utilization, expected)) <= 0.02
    assert result.preemptions == engine.scheduler.preemptions > 0
    # With async scheduling the engine schedules a step before the last one's tokens are
    # known; averaged over the run its utilisation still matches.
    async_engine = Engine(dataclasses.replace(config, use_async_scheduling=True))
    lagged = _engine_utilization(async_engine, trace)
    assert abs(statistics.fmean(lagged) - statistics.fmean(expected)) <= 0.02
    if prefix_caching:
        assert result.prefix_blocks_shared == engine.cache_stats()["prefix_hits"] > 0


def test_arrivals_wait_for_their_step_and_skip_idle_time() -> None:
    arrivals = Arrivals(
        Trace("t", [TraceRequest(0.0, 1, 1), TraceRequest(0.05, 1, 1), TraceRequest(3.0, 1, 1)]),
        step_s=0.02,
    )
    assert len(arrivals.due(busy=False)) == 1
    arrivals.tick()
    arrivals.tick()
    assert arrivals.due(busy=True) == []  # t=0.04 < 0.05
    arrivals.tick()
    assert len(arrivals.due(busy=True)) == 1  # t=0.06
    arrivals.tick()
    assert arrivals.due(busy=True) == []
    assert len(arrivals.due(busy=False)) == 1  # idle: jump to t=3
    assert arrivals.now == 3.0 and not arrivals.pending()


def test_sequential_traces_send_one_request_at_a_time() -> None:
    arrivals = Arrivals(Trace("s", [TraceRequest(0.0, 1, 1)] * 2, sequential=True))
    assert len(arrivals.due(busy=False)) == 1
    assert arrivals.due(busy=True) == []
    assert len(arrivals.due(busy=False)) == 1
    with pytest.raises(ValueError, match=r"^step_ms: "):
        Arrivals(Trace("s", []), step_s=0)


def test_refused_and_delayed(memory_only: EngineConfig) -> None:
    footprint = load_footprint("lab")
    trace = Trace(
        "t",
        [
            TraceRequest(0.0, 2048, 1),  # no room to generate within max_seq_len
            TraceRequest(0.0, 500, 10),
            TraceRequest(0.0, 500, 10),  # waits: the first leaves less than the reserve
            TraceRequest(0.0, 1500, 10),  # larger than the whole cache below
        ],
    )
    result = simulate(trace, "paged", footprint, 64 * footprint.block_bytes(16), memory_only)
    assert (result.refused, result.finished, result.delayed) == (2, 2, 1)
    assert result.requests == 4


def test_queue_limit_refuses(memory_only: EngineConfig) -> None:
    from dataclasses import replace

    config = replace(memory_only, max_waiting_requests=3)
    trace = make_trace("lab", num_requests=5)
    result = simulate(trace, "paged", load_footprint("lab"), 1 << 30, config)
    assert (result.refused, result.finished) == (2, 3)


def test_results_are_scalars_plus_a_timeline(memory_only: EngineConfig) -> None:
    result = simulate(
        make_trace("paged_attention"),
        "dynamic",
        load_footprint("llama-3.2-1b"),
        1 << 30,
        memory_only,
    )
    row = result.as_dict()
    assert "timeline" not in row
    assert {"strategy", "max_concurrent_sequences", "peak_utilization"} <= set(row)
    assert len(result.timeline.time_s) == result.steps == len(result.timeline.sequences)
    assert max(result.timeline.sequences) == result.max_concurrent_sequences
    assert all(t <= m for t, m in zip(result.timeline.token_bytes, result.timeline.memory_bytes))


def test_max_seq_len_is_required() -> None:
    with pytest.raises(ValueError, match=r"^max_seq_len: "):
        simulate(make_trace("lab"), "paged", load_footprint("lab"), 1 << 30, EngineConfig())
