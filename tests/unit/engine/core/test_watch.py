"""EngineWatch: pictures of the pool and queues, and steps recorded only while watched."""

from __future__ import annotations

import numpy as np

from infer.cache import PagedKVCachePool
from infer.config import EngineConfig
from infer.contract.sampling_params import SamplingParams
from infer.engine.core.request import Request
from infer.engine.core.scheduler import Scheduler
from infer.engine.core.watch import EngineWatch, mean_itl


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _scheduler(blocks: int = 8, **options: object) -> Scheduler:
    pool = PagedKVCachePool(blocks, 4)
    config = EngineConfig(device="cpu", use_prefix_caching=False, **options)  # type: ignore[arg-type]
    return Scheduler(config, pool, max_seq_len=64)


def _request(name: str, prompt: int, max_tokens: int = 4) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(name, list(range(prompt)), prompt, params, seed=0)


def _step(scheduler: Scheduler, watch: EngineWatch, clock: Clock) -> None:
    watch.begin()
    out = scheduler.schedule()
    clock.now += 0.5
    watch.launched(out, graphed=False)
    sampled = sum(c.samples for c in out.chunks)
    out.token_ids, out.logprobs = [0] * sampled, [None] * sampled
    scheduler.update(out)
    watch.stepped()


def test_a_view_lists_running_then_waiting_requests_and_their_blocks() -> None:
    scheduler = _scheduler(max_batch_size=1)
    scheduler.add_request(_request("a", 6))
    scheduler.add_request(_request("b", 3))
    clock = Clock()
    watch = EngineWatch(clock)
    _step(scheduler, watch, clock)
    view = watch.view(scheduler)
    assert view.requests == [
        ("a", "running", 6, 0, 6, 1, 2, 0, 4),  # 6 computed, 1 sampled, in 2 blocks
        ("b", "waiting", 3, 0, 0, 0, 0, 0, 4),
    ]
    assert view.num_waiting == 1 and view.time_s == 0.5 and view.backend == "paged"
    owner = np.frombuffer(view.blocks.owner, "<u2")
    assert owner[:2].tolist() == [0, 0]  # held by row 0: "a"


def test_steps_are_recorded_only_while_someone_watches() -> None:
    scheduler = _scheduler(prefill_chunk_size=4, long_prefill_threshold=0)
    scheduler.add_request(_request("a", 6))
    clock = Clock()
    watch = EngineWatch(clock, armed_s=2.0)
    assert not watch.armed
    watch.view(scheduler)
    assert watch.armed
    _step(scheduler, watch, clock)  # a prefill chunk of 4
    _step(scheduler, watch, clock)  # the last 2 prompt tokens
    _step(scheduler, watch, clock)  # a decode token
    steps = watch.view(scheduler).steps
    assert [(s.prefill_tokens, s.decode_tokens, s.rows) for s in steps] == [
        (4, 0, 1),
        (2, 0, 1),
        (0, 1, 1),
    ]
    assert [s.duration_s for s in steps] == [0.5] * 3 and steps[0].graphed is False
    assert watch.view(scheduler).steps == []  # handed over once
    clock.now += 2.5
    assert not watch.armed  # nobody asked for a while: the engine skips recording


def test_a_step_longer_than_the_arming_is_recorded_whole() -> None:
    scheduler = _scheduler()
    scheduler.add_request(_request("a", 6))
    clock = Clock()
    watch = EngineWatch(clock, armed_s=2.0)
    watch.view(scheduler)
    watch.begin()
    clock.now += 5.0  # a CPU's forward pass runs inside the launch
    watch.launched(scheduler.schedule(), graphed=None)
    watch.stepped()
    assert [(s.prefill_tokens, s.duration_s) for s in watch.view(scheduler).steps] == [(6, 5.0)]


def test_preemptions_and_latencies_reach_the_next_view() -> None:
    scheduler = _scheduler(blocks=3, admission_reserve=0.0)
    scheduler.add_request(_request("a", 4, max_tokens=8))
    scheduler.add_request(_request("b", 4, max_tokens=8))
    clock = Clock()
    watch = EngineWatch(clock)
    watch.view(scheduler)
    for _ in range(4):  # both grow into a third block each: the newest is preempted
        _step(scheduler, watch, clock)
    watch.finished(0.25, mean_itl([1.0, 1.5, 2.5]))
    view = watch.view(scheduler)
    assert [request_id for _, request_id in view.preempted] == ["b"]
    assert view.latencies == [(view.time_s, 0.25, 0.75)]


def test_mean_itl_needs_two_tokens() -> None:
    assert mean_itl([3.0]) is None
    assert mean_itl([1.0, 2.0, 4.0]) == 1.5
