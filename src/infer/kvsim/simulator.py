"""Replays a request trace against one allocation strategy, step by engine step.

The step is the engine's own: the simulator drives the engine's ``Scheduler`` (retire the
finished → running requests first, each a decode token or the next prefill chunk → admit
waiting requests within the batch, token and memory budgets, the 20 % admission reserve
included → preempt the newest request when a block is missing) over the strategy's pool,
then hands the scheduler's ``update`` what the model would have sampled: every sequence that
finished its prompt gains one fresh token, and a request stops at its ``output_tokens`` (or
at ``max_seq_len``). A finished sequence holds
its blocks until the next step retires it, as in the engine.

Time: every step lasts ``step_s``; requests join the waiting queue at the first step that
starts at or after their ``arrival_s`` (those of a sequential trace one at a time, when the
engine is idle), and when nothing is queued or running the clock jumps to the next arrival
(idle time is not simulated). Definitions of what is measured:

- utilisation: allocated blocks / pool blocks after each step (``Engine.utilization``);
  *mean* is the average over steps, *peak* the maximum.
- internal fragmentation: token positions inside allocated blocks holding no token, as a
  share of the allocated positions, summed over all steps (memory-weighted).
- external fragmentation: the share of the pool that was free while an allocation needing
  no more blocks than that was refused, averaged over steps (0 at steps without such a
  refusal); ``fragmentation_refusals`` counts those refusals. The allocation is the
  strategy's own: a whole slot (naive), a contiguous run (dynamic), the missing blocks
  (paged), so free memory between a contiguous allocator's regions counts, a paged pool's
  never can.
- refused: requests never served (prompt of ``max_seq_len`` tokens or more, waiting queue
  full, or too large for the whole cache). delayed: served requests that were not admitted
  at the step they arrived, or were preempted and recomputed later.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from tqdm import tqdm

from infer.config import EngineConfig
from infer.contract.errors import QueueFullError
from infer.contract.sampling_params import SamplingParams
from infer.engine.core.request import Request
from infer.engine.core.scheduler import Scheduler
from infer.kvsim.footprint import KVFootprint
from infer.kvsim.html import Replay
from infer.kvsim.pool import SimulatedPool
from infer.kvsim.strategies import build_pool
from infer.kvsim.trace import TokenIds, Trace, TraceRequest

DEFAULT_STEP_S = 0.02


class Arrivals:
    """Hands trace requests over as simulated time passes (idle time is skipped)."""

    def __init__(self, trace: Trace, step_s: float = DEFAULT_STEP_S) -> None:
        if step_s <= 0:
            raise ValueError(f"step_ms: must be > 0, got {step_s * 1000:g}")
        self.sequential = trace.sequential
        requests = trace.requests
        self._pending = deque(
            requests if self.sequential else sorted(requests, key=lambda r: r.arrival_s)
        )
        self.step_s = step_s
        self.now = 0.0

    def pending(self) -> bool:
        return bool(self._pending)

    def due(self, busy: bool) -> list[TraceRequest]:
        """Requests that arrived by the start of the coming step; when the engine is not
        ``busy``, the clock first jumps to the next arrival. A sequential trace hands over
        one request whenever the engine is idle."""
        if self.sequential:
            return [self._pending.popleft()] if self._pending and not busy else []
        if not busy and self._pending:
            self.now = max(self.now, self._pending[0].arrival_s)
        arrived = []
        while self._pending and self._pending[0].arrival_s <= self.now:
            arrived.append(self._pending.popleft())
        return arrived

    def tick(self) -> None:
        self.now += self.step_s


@dataclass
class Timeline:
    """Per-step samples, for plots."""

    time_s: list[float] = field(default_factory=list)
    memory_bytes: list[int] = field(default_factory=list)  # allocated
    token_bytes: list[int] = field(default_factory=list)  # holding computed tokens
    utilization: list[float] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)


@dataclass
class StrategyResult:
    """What one strategy did with one trace (see the module docstring for definitions)."""

    strategy: str
    num_blocks: int
    bytes_per_block: int
    requests: int
    finished: int
    refused: int
    delayed: int
    preemptions: int
    peak_utilization: float
    mean_utilization: float
    internal_fragmentation: float
    external_fragmentation: float
    fragmentation_refusals: int
    max_concurrent_sequences: int
    mean_concurrent_sequences: float
    prefix_blocks_shared: int
    steps: int
    duration_s: float
    timeline: Timeline = field(repr=False)

    def as_dict(self) -> dict[str, float | int | str]:
        """The scalar results (no timeline), as ``--json`` prints them."""
        return {k: v for k, v in vars(self).items() if k != "timeline"}


class _Run:
    """One simulation: the pool, the engine's scheduler, and the counters."""

    def __init__(
        self,
        pool: SimulatedPool,
        config: EngineConfig,
        max_seq_len: int,
        replay: Replay | None = None,
    ) -> None:
        self.pool = pool
        self.replay = replay
        self.max_seq_len = max_seq_len
        self.scheduler = Scheduler(config, pool, max_seq_len)
        self.token_ids = TokenIds()
        self._request_ids = itertools.count()
        self.arrived_at: dict[str, int] = {}  # request id → step it joined the queue
        self.admitted_at: dict[str, int] = {}  # request id → step it first got cache
        self.queued: list[Request] = []  # every request that entered the queue
        self.refused = 0
        self.timeline = Timeline()
        self.unused_slots = 0
        self.allocated_slots = 0
        self.stranded_blocks = 0

    def submit(self, spec: TraceRequest, step: int, now: float) -> bool:
        """Queue a trace request at simulated time ``now``; False if the engine would
        reject it."""
        if spec.prompt_tokens >= self.max_seq_len:
            self.refused += 1  # Engine.encode_prompt: no room to generate
            return False
        request_id = str(next(self._request_ids))
        params = SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True, detokenize=False)
        prompt = self.token_ids.prompt(spec)
        request = Request(request_id, prompt, len(prompt), params, seed=0)
        try:
            self.scheduler.add_request(request)
        except QueueFullError:
            self.refused += 1
            return False
        self.arrived_at[request_id] = step
        self.queued.append(request)
        if self.replay is not None:
            self.replay.arrived(request, now)
        return True

    def step(self, step: int, now: float, step_s: float) -> int:
        """One engine step from simulated time ``now``, the model's samples replaced by
        fresh token ids; returns how many requests ended in it. The pool is sampled while the
        step runs: requests that end in it free their cache as it is accounted."""
        scheduled = self.scheduler.schedule()
        self.pool.take_copies()  # no K/V to copy: the runner's part, dropped
        self.sample(now)
        self.refused += len(scheduled.failed)
        for request in self.scheduler.running:
            self.admitted_at.setdefault(request.request_id, step)
        num_samples = scheduled.num_samples
        scheduled.token_ids = self.token_ids.fresh(num_samples)
        scheduled.logprobs = [None] * num_samples
        accepted = self.scheduler.update(scheduled)
        if self.replay is not None:
            self.replay.stepped(scheduled, accepted, now, step_s)
            self.replay.capture(self.scheduler)
        return len(scheduled.failed) + sum(1 for t in accepted if t.request.is_finished)

    def sample(self, now: float) -> None:
        pool = self.pool
        used = pool.used_blocks()
        unused = pool.unused_token_slots()
        self.timeline.time_s.append(now)
        self.timeline.memory_bytes.append(used * pool.bytes_per_block)
        self.timeline.token_bytes.append(
            (used * pool.block_size - unused) * pool.bytes_per_block // pool.block_size
        )
        self.timeline.utilization.append(used / pool.num_blocks)
        self.timeline.sequences.append(pool.num_sequences())
        self.unused_slots += unused
        self.allocated_slots += used * pool.block_size
        self.stranded_blocks += pool.refusals.take_stranded()

    def result(self, strategy: str, requests: int, duration_s: float) -> StrategyResult:
        timeline = self.timeline
        steps = len(timeline.utilization)
        served = [r for r in self.queued if r.finish_reason == "length"]  # not failed
        delayed = sum(
            1
            for r in served
            if r.num_preemptions or self.admitted_at[r.request_id] > self.arrived_at[r.request_id]
        )
        return StrategyResult(
            strategy=strategy,
            num_blocks=self.pool.num_blocks,
            bytes_per_block=self.pool.bytes_per_block,
            requests=requests,
            finished=len(served),
            refused=self.refused,
            delayed=delayed,
            preemptions=self.scheduler.preemptions,
            peak_utilization=max(timeline.utilization, default=0.0),
            mean_utilization=sum(timeline.utilization) / steps if steps else 0.0,
            internal_fragmentation=(
                self.unused_slots / self.allocated_slots if self.allocated_slots else 0.0
            ),
            external_fragmentation=(
                self.stranded_blocks / (self.pool.num_blocks * steps) if steps else 0.0
            ),
            fragmentation_refusals=self.pool.refusals.fragmented,
            max_concurrent_sequences=max(timeline.sequences, default=0),
            mean_concurrent_sequences=sum(timeline.sequences) / steps if steps else 0.0,
            prefix_blocks_shared=self.pool.prefix_blocks_shared(),
            steps=steps,
            duration_s=duration_s,
            timeline=timeline,
        )


def simulate(
    trace: Trace,
    strategy: str,
    footprint: KVFootprint,
    memory_bytes: int,
    config: EngineConfig,
    *,
    window: int | None = None,
    step_s: float = DEFAULT_STEP_S,
    progress: bool = False,
    replay: Replay | None = None,
) -> StrategyResult:
    """Run ``trace`` through ``strategy`` with ``memory_bytes`` of KV cache.

    ``config`` supplies what the engine's scheduler reads (``block_size``, ``max_seq_len``
    — required here —, batch and token budgets, chunked prefill, admission reserve, queue
    limit); ``window`` is the sliding window of ``paged+window`` in tokens; ``replay``
    keeps the dashboard's frames of the run (``kvsim --html``).
    """
    if config.max_seq_len is None:
        raise ValueError("max_seq_len: the simulator needs an explicit max_seq_len")
    max_seq_len = config.max_seq_len
    pool = build_pool(strategy, footprint, memory_bytes, config.block_size, max_seq_len, window)
    run = _Run(pool, config, max_seq_len, replay)
    arrivals = Arrivals(trace, step_s)
    step = 0
    bar_off = None if progress else True  # None: shown on a terminal only
    with tqdm(
        total=len(trace.requests), desc=strategy, unit="req", leave=False, disable=bar_off
    ) as bar:
        while arrivals.pending() or run.scheduler.has_work():
            for spec in arrivals.due(run.scheduler.has_work()):
                if not run.submit(spec, step, arrivals.now):
                    bar.update()
            bar.update(run.step(step, arrivals.now, step_s))
            arrivals.tick()
            step += 1
    if replay is not None:
        replay.finish(run.scheduler)
    return run.result(strategy, len(trace.requests), arrivals.now)
