"""Decides, each step, how many tokens of which requests run.

Order of a step: ``retire`` (free the finished) → ``schedule``: running requests first,
oldest first (a decode token each, or the next prefill chunk), then admission of waiting
requests while the compute budget (``max_batch_size``, ``max_num_batched_tokens``) and the
token budget (free cache minus the generation reserve) allow. When a running request needs a
block and none is free, the newest running request is preempted: its blocks are freed and it
is re-queued at the front, to be recomputed later. Static batching admits a new batch only
when the previous one has finished.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from infer.cache.protocol import CachePoolProtocol
from infer.config import EngineConfig
from infer.engine.request import Request, RequestState
from infer.engine.structured import next_admissible


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_waiting_requests``; the caller should retry later."""


@dataclass
class ScheduledChunk:
    """``num_tokens`` tokens of ``request`` computed in this step."""

    request: Request
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the sequence, so a token is sampled."""
        return self.request.num_computed + self.num_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_decode_only(self) -> bool:
        return all(c.num_tokens == 1 and c.samples for c in self.chunks)


class Scheduler:
    def __init__(self, config: EngineConfig, pool: CachePoolProtocol, max_seq_len: int) -> None:
        self.config = config
        self.pool = pool
        self.max_seq_len = max_seq_len
        self.token_budget = config.resolved_max_num_batched_tokens(max_seq_len)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.failed: list[Request] = []  # finished at admission, for the engine to report
        self.preemptions = 0

    # --- queue ---------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if len(self.waiting) >= self.config.max_waiting_requests:
            raise QueueFullError(f"{len(self.waiting)} requests are waiting (max_waiting_requests)")
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        """Finish a request as aborted; its blocks are freed by the next ``retire``."""
        for request in [*self.running, *self.waiting]:
            if request.request_id == request_id and not request.is_finished:
                request.finish("abort")
                if request in self.waiting:
                    self.waiting.remove(request)
                return request
        return None

    def take_failed(self) -> list[Request]:
        failed, self.failed = self.failed, []
        return failed

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # --- the step ------------------------------------------------------------------------
    def retire(self) -> list[Request]:
        """Drop finished requests from the running set and free their cache."""
        retired = [r for r in self.running if r.is_finished]
        if retired:
            self.running = [r for r in self.running if not r.is_finished]
            for request in retired:
                self._release(request)
        return retired

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.token_budget
        prefills = 0
        for request in list(self.running):
            if request.state is not RequestState.RUNNING or budget == 0:
                continue
            num_tokens = self._tokens_to_run(request, budget, prefills)
            if num_tokens == 0:
                continue
            if not self._make_room(request, num_tokens, out):
                continue
            out.chunks.append(ScheduledChunk(request, num_tokens))
            budget -= num_tokens
            prefills += num_tokens > 1
        if not out.preempted and self._may_admit():
            self._admit(out, budget, prefills)
        return out

    def _tokens_to_run(self, request: Request, budget: int, prefills: int) -> int:
        remaining = request.num_tokens - request.num_computed
        if remaining <= 1:
            return remaining
        cap = self.config.max_prefill_chunks_per_step
        if cap is not None and prefills >= cap:
            return 0
        if not self.config.use_chunked_prefill:
            return remaining if remaining <= budget else 0
        return min(remaining, budget, self.config.prefill_chunk_size)

    def _make_room(self, request: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Get blocks for the request's next tokens, preempting the newest requests."""
        assert request.slot is not None
        while not self.pool.prepare_append(request.slot, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._release(request)
        request.state = RequestState.WAITING
        request.num_computed = 0
        request.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        if request.slot is not None:
            self.pool.free_slot(request.slot)
            request.slot = None

    def _may_admit(self) -> bool:
        if self.config.batching_mode == "static":
            return not self.running
        return True

    def _admit(self, out: SchedulerOutput, budget: int, prefills: int) -> None:
        free_tokens = self.pool.free_token_capacity()
        admissible = (
            None
            if free_tokens is None
            else int(free_tokens * (1.0 - self.config.admission_reserve))
        )
        cap = self.config.max_prefill_chunks_per_step
        while self.waiting and len(self.running) < self.config.max_batch_size and budget > 0:
            if cap is not None and prefills >= cap:
                break
            request = next_admissible(self.waiting, self.failed)  # grammar compiled, if any
            if request is None:
                break
            if admissible is not None and request.num_tokens > admissible and self.running:
                break  # keep the reserve for running requests' growth
            if not self._start(request):
                if not self.running:  # alone and still too big: it can never run
                    self.waiting.remove(request)
                    request.finish("error", "the KV cache is too small for this request")
                    self.failed.append(request)
                break
            self.waiting.remove(request)
            self.running.append(request)
            num_tokens = self._tokens_to_run(request, budget, prefills)
            if num_tokens == 0:
                continue
            out.chunks.append(ScheduledChunk(request, num_tokens))
            budget -= num_tokens
            prefills += num_tokens > 1
            if admissible is not None:
                admissible -= request.num_tokens

    def _start(self, request: Request) -> bool:
        """Give a waiting request its slot (prefix hits included) and its prompt's blocks."""
        tokens = request.token_ids
        try:
            slot = self.pool.allocate_slot(0, tokens)
        except RuntimeError:
            return False
        computed = self.pool.get_seq_len(slot)
        if not self.pool.prepare_append(slot, len(tokens) - computed):
            self.pool.free_slot(slot)
            return False
        request.slot = slot
        request.num_computed = computed
        request.state = RequestState.RUNNING
        return True
