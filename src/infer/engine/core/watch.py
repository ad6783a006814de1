"""What the dashboard sees of an engine: pictures of its pool and queues, and its steps.

``view()`` takes a picture between two steps (the pool's blocks, the running and waiting
requests) and hands over what was recorded since the previous one: each step's make-up and
time, finished requests' latencies, preemptions. Recording costs a few attribute reads per
step, and only while someone watches: each ``view()`` arms it for ``armed_s`` seconds, so an
engine whose dashboard closed records nothing. The simulator (``kvsim --html``) drives one
on its simulated clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from infer.contract.engine_view import EngineView, RequestRow, StepRecord
from infer.engine.core.request import Request
from infer.engine.core.scheduler import Scheduler
from infer.engine.core.step import Step

ARMED_S = 2.0  # a dashboard asks several times a second; this outlasts a slow network
MAX_RECORDS = 4096  # per kind, between two views (a view every ~200 ms needs far fewer)
MAX_WAITING_ROWS = 64  # the queue's head; its length is sent whole


class EngineWatch:
    """Records an engine's steps while watched, and takes its pictures (``view``)."""

    def __init__(
        self, clock: Callable[[], float] = time.perf_counter, armed_s: float = ARMED_S
    ) -> None:
        self._clock = clock
        self._origin = clock()
        self._armed_s = armed_s
        self._armed_until = float("-inf")
        self._steps: deque[StepRecord] = deque(maxlen=MAX_RECORDS)
        self._latencies: deque[tuple[float, float, float | None]] = deque(maxlen=MAX_RECORDS)
        self._preempted: deque[tuple[float, str]] = deque(maxlen=MAX_RECORDS)
        self.recording = False  # between ``begin`` and ``stepped``
        self._begun = 0.0
        self._launched = [0, 0, 0]  # prefill tokens, decode tokens, rows: of this step
        self._graphed: bool | None = None

    @property
    def armed(self) -> bool:
        """Whether a view was asked for lately (only then are steps recorded)."""
        return self._clock() < self._armed_until

    def now(self) -> float:
        """Seconds since the watch began, on its clock."""
        return self._clock() - self._origin

    def begin(self) -> None:
        """A ``step`` call begins; it is recorded whole, however long it runs (a step on a
        CPU may outlast ``armed_s``)."""
        self.recording = True
        self._begun = self.now()

    def launched(self, step: Step, graphed: bool | None) -> None:
        """The step call queued a step on the device (it may queue one, or none)."""
        decode = sum(
            c.num_tokens == 1 and c.start >= c.request.num_prompt_tokens for c in step.chunks
        )
        self._launched[0] += step.num_tokens - decode
        self._launched[1] += decode
        self._launched[2] += len(step.chunks)
        self._graphed = graphed if self._graphed is None else self._graphed and graphed
        now = self.now()
        self._preempted.extend((now, r.request_id) for r in step.preempted)

    def stepped(self) -> None:
        """The ``step`` call returned."""
        prefill, decode, rows = self._launched
        if rows:
            now = self.now()
            record = StepRecord(now, now - self._begun, prefill, decode, rows, self._graphed)
            self._steps.append(record)
        self.recording = False
        self._launched = [0, 0, 0]
        self._graphed = None

    def finished(self, ttft_s: float, itl_s: float | None) -> None:
        """A request ended: its time to first token and mean inter-token latency."""
        self._latencies.append((self.now(), ttft_s, itl_s))

    def view(self, scheduler: Scheduler) -> EngineView:
        """A picture of ``scheduler``'s pool and queues, with the records since the last
        one (taken between steps); arms the recording for ``armed_s`` seconds."""
        self._armed_until = self._clock() + self._armed_s
        pool, config = scheduler.pool, scheduler.config
        running = scheduler.running
        rows = [_running_row(r, pool.get_seq_len, pool.block_table) for r in running]
        waiting = list(scheduler.waiting)[:MAX_WAITING_ROWS]
        rows += [_row(r, "waiting", 0, 0) for r in waiting]
        owners = [-1 if r.seq_id is None else r.seq_id for r in running]
        view = EngineView(
            time_s=self.now(),
            backend=pool.backend,
            blocks=pool.block_map(owners),
            requests=rows,
            num_waiting=len(scheduler.waiting),
            chunk_size=config.prefill_chunk_size if config.use_chunked_prefill else None,
            steps=list(self._steps),
            latencies=list(self._latencies),
            preempted=list(self._preempted),
        )
        self._steps.clear()
        self._latencies.clear()
        self._preempted.clear()
        return view


def _running_row(
    request: Request, seq_len: Callable[[int], int], table: Callable[[int], list[int]]
) -> RequestRow:
    if request.seq_id is None:  # finished, not retired yet
        return _row(request, request.state.value, 0, 0)
    return _row(request, request.state.value, seq_len(request.seq_id), len(table(request.seq_id)))


def _row(request: Request, state: str, computed: int, blocks: int) -> RequestRow:
    return (
        request.request_id,
        state,
        request.num_prompt_tokens,
        request.num_cached_tokens,
        computed,
        request.num_output_tokens,
        blocks,
        request.num_preemptions,
        request.params.max_tokens,
    )


def mean_itl(token_times_s: list[float]) -> float | None:
    """Mean time between a request's tokens; None for fewer than two."""
    if len(token_times_s) < 2:
        return None
    return (token_times_s[-1] - token_times_s[0]) / (len(token_times_s) - 1)
