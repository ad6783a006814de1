"""Decides, each step, how many tokens of which requests run (it creates the ``Step``), and
accounts for what ran (``update`` consumes the step, its samples collected).

``schedule``: retire the finished (freeing their cache) → running requests first, oldest
first (a decode token each, or the next prefill chunk) → admission of waiting requests while
the compute budget (``max_batch_size``, ``max_num_batched_tokens``) and the token budget
(free cache minus the generation reserve) allow. When a running request needs a block and
none is free, the newest running request is preempted: its blocks are freed and it is
re-queued at the front, to be recomputed later. Static batching admits a new batch only
when the previous one has finished. Scheduled tokens count as computed at once (their K/V
is being written), so the pool's length of a sequence is the one place that says how much
of it is cached.

``update``: once the step's samples are collected, each sampled token is appended, the stop
rules run, and the sequence's newly full blocks are offered for prefix sharing.

``schedule_ahead`` (async scheduling): the step after the one in flight, decided by the
same rules before that step's tokens reach the host: decode rows, next prefill chunks and
admissions alike. A token sampled in flight is a *placeholder* (``Request.num_placeholders``)
until ``update`` replaces it; the step ahead takes it from the device (``fed_rows``). What
needs the host first (a preemption, a suspect to run alone) waits for a synchronous step.

With a ``speculative_config``, a decoding row may run its next token and the tokens
``speculative/speculation.py`` proposes after it (``ScheduledChunk.proposals``): every one
is sampled, ``update`` keeps those the target agrees with and rewinds the cache over the
rest. Such steps are synchronous: the host must know what a step accepted to schedule the
next.

Where the runner makes n-gram proposals on the device (``use_device_proposals``), a step of
decoding rows can *verify* instead (``verify_queries``): every row runs that many tokens, its
first and the proposals the device finds, and the device keeps what stands. Such steps are
scheduled ahead like plain ones: the cache grows by all of a row's tokens (the most it can
keep) and ``update`` rewinds it over what was not kept, once it knows; a row's next step
starts as if the one in flight kept one token, and the device adds the rest.

A step that raised is handed back with ``recover``: its requests are recomputed, and each
runs alone until it samples again, so the request that makes steps fail is found and only it
gets the error.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass

from infer.cache.protocol import CachePoolProtocol
from infer.config import EngineConfig
from infer.contract.constraints import GRAMMAR_FIELD
from infer.contract.errors import QueueFullError
from infer.contract.outputs import TokenLogprob
from infer.contract.speculation_stats import SpeculationStats
from infer.engine.core.output import record_token
from infer.engine.core.request import Request, RequestState
from infer.engine.core.step import ScheduledChunk, Step
from infer.engine.speculative.speculation import (
    HOST_PROPOSALS,
    NgramProposer,
    Proposer,
    SpeculationGate,
    VerifyCosts,
    accepted_length,
)

# A request in this many failed steps is failed, even where it never failed alone.
MAX_FAILED_STEPS = 3
# A long prompt's chunks short of its end are whole multiples of this many tokens.
LONG_CHUNK_ALIGN = 1024
# Beside decode rows, while at most this many prompts wait for their first token, a step
# carries one prompt's chunk (``Scheduler._prompt_chunk_cap``).
SERIAL_PROMPTS = 2


@dataclass(slots=True)
class SampledTokens:
    """The tokens ``update`` accepted for a request (one, or more where proposals were
    accepted), with the text they released for streaming."""

    request: Request
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    text: str


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        pool: CachePoolProtocol,
        max_seq_len: int,
        proposer: Proposer | None = None,
    ) -> None:
        """``proposer``: where speculative steps' proposals come from (needs the config's
        ``speculative_config``)."""
        self.config = config
        self.pool = pool
        self.max_seq_len = max_seq_len
        self.token_budget = config.resolved_max_num_batched_tokens(max_seq_len)
        # What a long prompt's chunk may take beyond the budget (the rest of the step's
        # tokens then wait for the next step).
        self.long_overdraft = config.resolved_long_prefill_step_tokens(max_seq_len) - (
            self.token_budget
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        spec = config.speculative_config
        self.proposer = proposer
        self.gate = None
        if spec is not None and proposer is not None:
            lookup = proposer.lookup if isinstance(proposer, NgramProposer) else None
            self.gate = SpeculationGate(spec, shadow=lookup)
        self.speculation = SpeculationStats()
        self.costs = VerifyCosts()
        self.verify_queries = 0  # (``use_device_proposals``)
        self._verifying: dict[str, ScheduledChunk] = {}  # each request's latest verify row

    def use_device_proposals(self, queries: int, costs: VerifyCosts) -> None:
        """The runner verifies ``queries`` tokens a row with n-gram proposals made on the
        device, at ``costs``: decoding batches speculate that way, scheduled ahead."""
        self.verify_queries = queries
        self.costs = costs

    # --- queue ---------------------------------------------------------------------------
    def add_request(self, request: Request, *, bounded: bool = True) -> None:
        """Queue a request. ``bounded``: refuse it with ``QueueFullError`` when
        ``max_waiting_requests`` wait already; callers that own their requests' lifetime
        (``LLM.generate``, the benchmarks, the server's engine process, whose API process
        bounds intake) queue beyond it."""
        if bounded and len(self.waiting) >= self.config.max_waiting_requests:
            raise QueueFullError(f"{len(self.waiting)} requests are waiting (max_waiting_requests)")
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        """Finish a request as aborted; its blocks are freed by the next ``schedule``."""
        for request in [*self.running, *self.waiting]:
            if request.request_id == request_id and not request.is_finished:
                request.finish("abort")
                if request in self.waiting:
                    self.waiting.remove(request)
                return request
        return None

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def num_computed(self, request: Request) -> int:
        """Tokens of the request whose K/V is cached (or being written by a step)."""
        return 0 if request.seq_id is None else self.pool.get_seq_len(request.seq_id)

    # --- before the forward pass -----------------------------------------------------------
    def schedule(self) -> Step:
        """The next step; nothing may be in flight (every placeholder resolved)."""
        self.retire()
        out = Step()
        suspect = self._first_suspect()
        if suspect is not None and self._schedule_alone(suspect, out):
            return out
        verify = self._verify_step(None)
        if verify is not None:
            return verify
        self._fill(out, ahead=False)
        if self._host_proposals():
            self._add_proposals(out)
        return out

    def schedule_ahead(self, previous: Step) -> Step | None:
        """The step after ``previous`` (in flight), by the rules of ``schedule``; the rows
        that sampled in ``previous`` run their placeholder, fed from its samples on the
        device. None when the next step needs the host first: a suspect runs alone, blocks
        ran short (preemption frees the in-flight step's blocks), or nothing is left to run.
        Where a row's sampling reads its output so far (``needs_output_tokens``), the engine
        queues only the forward pass ahead and samples once the tokens are known."""
        if previous.needs_host or self._first_suspect() is not None:
            return None
        # The input of a row after a step with host proposals is its last accepted sample,
        # which only the host knows.
        if previous.speculative:
            return None
        self.retire()
        verify = self._verify_step(previous)
        if verify is not None:
            return verify
        # After a verify step only the device knows where its rows go on; and host
        # proposals wait for the host.
        if previous.verify_queries or self._host_proposals():
            return None
        out = Step()
        self._fill(out, ahead=True)
        if not out.chunks:
            if out.failed:  # failed at admission: reported with the step in flight
                return out
            return None
        sample_rows = {id(c.request): i for i, c in enumerate(previous.chunks_that_sample())}
        out.fed_rows = [
            (row, sample_rows[id(c.request)])
            for row, c in enumerate(out.chunks)
            if c.start >= len(c.request.token_ids)
        ]
        return out

    def _first_suspect(self) -> Request | None:
        """A request recovering from a failed step (it runs alone, synchronously)."""
        return next((r for r in itertools.chain(self.running, self.waiting) if r.suspect), None)

    def _fill(self, out: Step, *, ahead: bool) -> None:
        """Running requests first (a decode token or the next chunk), then admissions,
        within the step's budget. ``ahead``: a placeholder that ends its request is not
        continued, and a shortage of blocks stops the step instead of preempting."""
        budget = self.token_budget
        prefills = 0
        remaining = [self._remaining(r) for r in self.running]
        decodes = remaining.count(1)
        cap = self._prompt_chunk_cap(decodes, sum(n > 1 for n in remaining))
        unscheduled = decodes  # decode rows still to come: a chunk leaves them their tokens
        for request in list(self.running):  # (a preemption changes a later row's remaining)
            decoding = self._remaining(request) == 1
            unscheduled -= decoding
            # (a long chunk's overdraft leaves the budget below zero, its decode rows in it)
            if request.state is not RequestState.RUNNING or (budget <= 0 and not decoding):
                continue
            if ahead and request.num_placeholders and self._ends_in_flight(request):
                continue
            num_tokens = self._tokens_to_run(request, budget, prefills, cap, decodes, unscheduled)
            if num_tokens == 0:
                continue
            if not self._make_room(request, num_tokens, out, ahead=ahead):
                if out.needs_host:
                    return
                continue
            self._add_chunk(out, request, num_tokens)
            budget -= num_tokens
            prefills += num_tokens > 1
        if not out.preempted and self._may_admit():
            self._admit(out, budget, prefills, cap, decodes)

    def _prompt_chunk_cap(self, decodes: int, prefilling: int) -> int | None:
        """How many prompts may run a chunk in one step (``prefilling``: running requests
        still in their prompt). Beside decode rows, while at most ``SERIAL_PROMPTS`` prompts
        wait for their first token, one: a second chunk in the step would make it another
        slow gap for every decoding row (the tail of their inter-token latency), and the
        second prompt waits only for the first one's few chunks. More prompts share the step
        (``max_prefill_chunks_per_step``), so prefill keeps up."""
        cap = self.config.max_prefill_chunks_per_step
        if decodes == 0 or not self.config.use_chunked_prefill:
            return cap
        return 1 if len(self.waiting) + prefilling <= SERIAL_PROMPTS else cap

    # --- speculation ----------------------------------------------------------------------
    def _host_proposals(self) -> bool:
        """Whether steps propose on the host (a draft model, or rows whose sampling reads
        their outputs) and the gate lets the running rows propose."""
        if self.gate is None or not self.running or not self._may_speculate():
            return False
        if self._device_proposals and all(self._verifiable(r) for r in self.running):
            return False
        return any(self.gate.limits(self.running, HOST_PROPOSALS))

    def _add_proposals(self, out: Step) -> None:
        """Proposed tokens after each decoding row's token, within the step's budget, the
        requests' lengths and free blocks (proposals never preempt)."""
        assert self.proposer is not None and self.gate is not None
        rows = [c for c in out.chunks if c.samples and c.num_tokens == 1]
        allowed = self.gate.limits([c.request for c in rows], HOST_PROPOSALS)
        limits = [min(a, self._room_to_grow(c.request)) for c, a in zip(rows, allowed)]
        if not any(limits):
            return
        budget = self.token_budget - out.num_tokens
        for chunk, limit in zip(rows, limits):
            chunk.proposal_limit = max(limit, 0)
        proposed = self.proposer.propose([c.request for c in rows], limits)
        for chunk, proposals in zip(rows, proposed):
            proposals = proposals[: max(budget, 0)]
            seq_id = chunk.request.seq_id
            assert seq_id is not None
            if not proposals or not self.pool.prepare_append(seq_id, 1 + len(proposals)):
                continue
            chunk.proposals = proposals
            chunk.num_tokens += len(proposals)
            self.pool.advance(seq_id, len(proposals))
            budget -= len(proposals)
            out.speculative = True  # (a step without proposals is a plain one)

    @property
    def _device_proposals(self) -> bool:
        """Whether n-gram proposals are made on the device (a proposer set since, e.g. a
        test's, proposes on the host)."""
        return bool(self.verify_queries) and isinstance(self.proposer, NgramProposer)

    def _may_speculate(self) -> bool:
        """Whether proposals could pay at all for the running batch (a wide one is
        compute-bound: checking them costs more than even all of them accepted yield)."""
        spec, count = self.config.speculative_config, len(self.running)
        assert spec is not None
        cost = self.costs.device(count)  # None: too wide for a verify step
        if cost is not None and not self._device_proposals:
            cost = HOST_PROPOSALS
        return (
            cost is not None
            and cost < spec.num_speculative_tokens + 1
            and spec.speculates_at(count)
        )

    def _verifiable(self, request: Request) -> bool:
        """Whether a request's next step may verify device proposals: it decodes, and its
        sampling reads nothing of its outputs on the host."""
        params = request.params
        return (
            request.state is RequestState.RUNNING
            and not request.suspect
            and not params.needs_output_tokens
            and request.num_output_tokens >= params.min_tokens
        )

    def _verify_step(self, previous: Step | None) -> Step | None:
        """Every running row verifying device proposals, after ``previous`` (in flight) or
        after a collected step; None when such a step cannot run now: no verify graph holds
        the batch or the gate keeps it from speculating, a row is not decoding (or not
        ``_verifiable``), a request waits to be admitted, or blocks are short."""
        queries, rows = self.verify_queries, self.running
        if not self._device_proposals or self.gate is None or not rows:
            return None
        cost = self.costs.device(len(rows))
        if cost is None or cost >= queries or self._admits_now():
            return None
        limits = self.gate.limits(rows, cost)
        limits = [min(limit, self._room_to_grow(r)) for r, limit in zip(rows, limits)]
        if not any(limit > 0 for limit in limits):
            return None
        starts = self._verify_starts(rows, previous)
        if starts is None:
            return None
        for request in rows:  # the most the row can keep (``update`` gives back the rest)
            if not self.pool.prepare_append(request.seq_id, queries):  # type: ignore[arg-type]
                return None
        out = Step(verify_queries=queries)
        for row, (request, limit, (start, fed)) in enumerate(zip(rows, limits, starts)):
            chunk = ScheduledChunk(request, start, queries, True, [], max(limit, 0), verify=True)
            out.chunks.append(chunk)
            self.pool.advance(request.seq_id, queries)  # type: ignore[arg-type]
            request.num_placeholders += 1
            if fed is not None:
                out.fed_rows.append((row, fed))
            self._verifying[request.request_id] = chunk
        return out

    def _verify_starts(
        self, rows: list[Request], previous: Step | None
    ) -> list[tuple[int, int | None]] | None:
        """Where each row's verify tokens start as far as the host knows, and which sample
        of ``previous`` feeds it; None when a row cannot verify."""
        queries = self.verify_queries
        starts: list[tuple[int, int | None]] = []
        if previous is None:
            for request in rows:
                if not self._verifiable(request) or self._remaining(request) != 1:
                    return None
                starts.append((self.num_computed(request), None))
        else:
            sampled = {id(c.request): (i, c) for i, c in enumerate(previous.chunks_that_sample())}
            for request in rows:
                entry = sampled.get(id(request))
                if entry is None or not self._verifiable(request):
                    return None
                index, chunk = entry
                # After a verify row the device knows how far it went: up to ``queries`` on.
                start = chunk.start + (1 if chunk.verify else chunk.num_tokens)
                starts.append((start, index))
        reach = queries * (2 if previous is not None and previous.verify_queries else 1)
        if any(start + reach > self.max_seq_len for start, _ in starts):
            return None
        return starts

    def _admits_now(self) -> bool:
        """Whether a waiting request could join the next step (which then is not a verify
        step: its prompt runs beside the decoding rows), by the rules of ``_admit``."""
        if not self.waiting or len(self.running) >= self.config.max_batch_size:
            return False
        request = next_admissible(self.waiting, []) if self._may_admit() else None
        if request is None:
            return False
        free = self.pool.free_token_capacity()
        reserve = 1.0 - self.config.admission_reserve
        return free is None or request.num_tokens <= int(free * reserve) or not self.running

    def _room_to_grow(self, request: Request) -> int:
        """Tokens the request may still produce after its next one."""
        room = self.max_seq_len - request.num_tokens - 1
        if request.params.max_tokens is not None:
            room = min(room, request.params.max_tokens - request.num_output_tokens - 1)
        return room

    def _ends_in_flight(self, request: Request) -> bool:
        """Whether the token in flight is the request's last by length."""
        return request.reaches_length(request.num_tokens_with_pending, self.max_seq_len)

    def _add_chunk(self, out: Step, request: Request, num_tokens: int) -> None:
        assert request.seq_id is not None
        start = self.pool.get_seq_len(request.seq_id)
        samples = start + num_tokens == request.num_tokens_with_pending
        out.chunks.append(ScheduledChunk(request, start, num_tokens, samples))
        if request.prompt_logprobs is not None:
            out.scores_prompts = True
        self.pool.advance(request.seq_id, num_tokens)
        request.num_placeholders += samples

    def _schedule_alone(self, request: Request, out: Step) -> bool:
        """Schedule only ``request`` (a suspect of a failed step); False if it cannot run."""
        if request.state is RequestState.WAITING:
            if not self._start(request):
                return False
            self.waiting.remove(request)
            self.running.append(request)
        num_tokens = self._tokens_to_run(request, self.token_budget, 0, None)  # the only chunk
        if num_tokens == 0 or not self.pool.prepare_append(request.seq_id, num_tokens):  # type: ignore[arg-type]
            return False
        self._add_chunk(out, request, num_tokens)
        return True

    def retire(self) -> None:
        """Drop finished requests from the running set and free their cache."""
        if any(r.is_finished for r in self.running):
            retired = [r for r in self.running if r.is_finished]
            self.running = [r for r in self.running if not r.is_finished]
            for request in retired:
                self._release(request)

    def _remaining(self, request: Request) -> int:
        return request.num_tokens_with_pending - self.num_computed(request)

    def _tokens_to_run(
        self,
        request: Request,
        budget: int,
        prefills: int,
        cap: int | None,
        decodes: int = 0,
        reserved: int = 0,
    ) -> int:
        """How many of the request's tokens run in a step with ``decodes`` decode rows, out
        of ``budget`` less ``reserved`` (decode rows still to come), ``prefills`` chunks
        already in it and at most ``cap`` of them. Small chunks serve the
        inter-token latency of decode rows and nothing else: with none, a chunk is as large
        as the budget; for a sequence longer than ``long_prefill_threshold`` (whose small
        chunks would each read its growing context and leave its first token hundreds of
        steps away), as large as a long prompt's step budget, beside decode rows too
        (``benchmarks/results-by-topic/14-long-context.md``). A threshold of 0 keeps every
        chunk at ``prefill_chunk_size``."""
        remaining = self._remaining(request)
        if remaining <= 1:
            return remaining
        if cap is not None and prefills >= cap:
            return 0
        room = max(budget - reserved, 0)
        if not self.config.use_chunked_prefill:
            return remaining if remaining <= room else 0
        threshold = self.config.long_prefill_threshold
        if threshold > 0 and request.num_tokens > threshold:
            # At the default budget the step's decode rows ride beside a long chunk, not in
            # it: a 16k prompt takes one step where a last small chunk would be a second
            # slow gap for every row (an explicit max_num_batched_tokens counts them).
            riding = decodes if self.long_overdraft > 0 else 0
            room = max(budget + self.long_overdraft - reserved + riding, 0)
            if room >= remaining:
                return remaining
            # Whole multiples of LONG_CHUNK_ALIGN: cuDNN plans each attention shape on the
            # host (~60 ms, benchmarks/results-by-topic/14-long-context.md, 14.3), and
            # aligned chunks meet the shapes seen before.
            return room - room % LONG_CHUNK_ALIGN if room >= LONG_CHUNK_ALIGN else room
        if threshold > 0 and decodes == 0:
            return min(remaining, room)
        size = self.config.prefill_chunk_size
        if remaining > size and prefills == 0:
            size = max(size - decodes, (size + 1) // 2)
        return min(remaining, room, size)

    def _make_room(self, request: Request, num_tokens: int, out: Step, *, ahead: bool) -> bool:
        """Get blocks for the request's next tokens, preempting the newest requests; ahead
        of a step in flight (whose blocks a preemption would free) the step needs the host."""
        assert request.seq_id is not None
        while not self.pool.prepare_append(request.seq_id, num_tokens):
            if ahead:
                out.needs_host = True
                return False
            victim = self.running[-1]
            self._requeue(victim)
            self.preemptions += 1
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _requeue(self, request: Request) -> None:
        """Free the request's cache and queue it at the front, to be recomputed."""
        self.running.remove(request)
        self._release(request)
        request.state = RequestState.WAITING
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        request.num_placeholders = 0
        self._verifying.pop(request.request_id, None)
        if self.proposer is not None:
            self.proposer.forget(request)
        if self.gate is not None:
            self.gate.forget(request)
        if request.seq_id is not None:
            self.pool.free_sequence(request.seq_id)
            request.seq_id = None

    def _may_admit(self) -> bool:
        if self.config.batching_mode == "static":
            return not self.running
        return True

    def _admit(self, out: Step, budget: int, prefills: int, cap: int | None, decodes: int) -> None:
        free_tokens = self.pool.free_token_capacity()
        admissible = (
            None
            if free_tokens is None
            else int(free_tokens * (1.0 - self.config.admission_reserve))
        )
        while self.waiting and len(self.running) < self.config.max_batch_size and budget > 0:
            if cap is not None and prefills >= cap:
                break
            request = next_admissible(self.waiting, out.failed)  # grammar compiled, if any
            if request is None:
                break
            if admissible is not None and request.num_tokens > admissible and self.running:
                break  # keep the reserve for running requests' growth
            if not self._start(request):
                if not self.running:  # alone and still too big: it can never run
                    self.waiting.remove(request)
                    request.finish("error", "the KV cache is too small for this request")
                    out.failed.append(request)
                break
            self.waiting.remove(request)
            self.running.append(request)
            num_tokens = self._tokens_to_run(request, budget, prefills, cap, decodes)
            if num_tokens == 0:
                continue
            self._add_chunk(out, request, num_tokens)
            budget -= num_tokens
            prefills += num_tokens > 1
            if admissible is not None:
                admissible -= request.num_tokens

    def _start(self, request: Request) -> bool:
        """Give a waiting request its sequence (prefix hits included) and its prompt's blocks."""
        tokens = request.token_ids
        if request.prompt_logprobs is None:
            seq_id = self.pool.allocate_sequence(
                0, tokens, request.block_keys, request.params.cache_salt
            )
        else:  # it scores every prompt position: none may come from the prefix cache
            seq_id = self.pool.allocate_sequence(0)
        if seq_id is None:
            return False
        computed = self.pool.get_seq_len(seq_id)
        if not self.pool.prepare_append(seq_id, len(tokens) - computed):
            self.pool.free_sequence(seq_id)
            return False
        request.seq_id = seq_id
        request.num_cached_tokens = computed
        request.state = RequestState.RUNNING
        return True

    # --- after the forward pass -------------------------------------------------------------
    def update(self, step: Step) -> list[SampledTokens]:
        """Account a collected step (its samples on the host): each sampled token replaces
        its placeholder, is detokenised and checked against the stop rules; completed blocks
        become shareable. Tokens of requests that ended while the step was in flight are
        dropped. A chunk with proposals keeps the samples ``accepted_length`` allows; the
        cache forgets the rest. Requests that end here free their cache at once: whoever
        reads the outputs then sees it free (a step in flight that still writes it was
        queued before any new owner's)."""
        now = time.perf_counter()
        accepted = []
        first = 0
        sampling = step.chunks_that_sample()
        for index, chunk in enumerate(sampling):
            request, count = chunk.request, chunk.num_samples
            if not request.is_finished:
                request.num_placeholders -= 1
                if request.suspect:
                    request.suspect = False  # it ran a whole step alone without failing
                kept = 1
                if chunk.verify:
                    assert step.accepted is not None and step.num_proposals is not None
                    kept = self._verified(chunk, step.accepted[index], step.num_proposals[index])
                elif count > 1:
                    kept = self._accept(chunk, step.token_ids[first : first + count])
                accepted.append(self._record(request, step, first, kept, now))
            first += count
        if self.gate is not None and self._may_speculate():
            self.gate.observe(
                [c.request for c in sampling if not c.proposal_limit and not c.request.is_finished]
            )  # (a host proposer that found nothing: no cost, nothing learnt)
        ended = False
        for chunk in step.chunks:
            request = chunk.request
            if request.is_finished:
                ended = True
            elif request.seq_id is not None:
                # Placeholders sit at or past the computed length, which is all it reads.
                self.pool.index_blocks(request.seq_id, request.token_ids)
        if ended:  # the running set is scanned only on the steps where requests end
            self.retire()
        return accepted

    def _accept(self, chunk: ScheduledChunk, samples: list[int]) -> int:
        """How many of a speculative chunk's samples stand; the cache forgets the rest."""
        kept = accepted_length(chunk.proposals, samples)
        self.speculation.record(len(chunk.proposals), kept - 1)
        if self.gate is not None:
            self.gate.record(chunk.request, kept - 1)
        assert chunk.request.seq_id is not None
        self.pool.rewind(chunk.request.seq_id, len(samples) - kept)
        return kept

    def _verified(self, chunk: ScheduledChunk, accepted: int, proposed: int) -> int:
        """How many of a verify row's samples stand (``accepted`` of its ``proposed``
        proposals, and the sample after them); the cache forgets the rest, and the row's
        next verify step, if queued, learns where it really starts."""
        request = chunk.request
        if proposed:
            self.speculation.record(proposed, accepted)
        if chunk.proposal_limit and self.gate is not None:
            self.gate.record(request, accepted)
        assert request.seq_id is not None
        self.pool.rewind(request.seq_id, chunk.num_tokens - 1 - accepted)
        latest = self._verifying.get(request.request_id)
        if latest is chunk:
            del self._verifying[request.request_id]
        elif latest is not None:
            latest.start += accepted
        return 1 + accepted

    def _record(
        self, request: Request, step: Step, first: int, kept: int, now: float
    ) -> SampledTokens:
        """Record the request's ``kept`` samples from row ``first`` on, until one ends it."""
        new = SampledTokens(request, [], [], "")
        for row in range(first, first + kept):
            token_id, logprob = step.token_ids[row], step.logprobs[row]
            if logprob is not None:
                request.logprobs.append(logprob)
                new.logprobs.append(logprob)
            new.token_ids.append(token_id)
            new.text += record_token(request, token_id, now, self.max_seq_len)
            if request.is_finished:
                request.num_placeholders = 0  # a token queued after its end is not wanted
                break
        return new

    def recover(self, requests: list[Request], error: str) -> list[Request]:
        """Take back the requests of a step that raised; returns those that fail for it.

        A request that was alone in the step, or in ``MAX_FAILED_STEPS`` failed steps, is
        the cause and finishes with ``error``; the others are recomputed, each alone first.
        """
        alive = list({id(r): r for r in requests if not r.is_finished}.values())
        failed = []
        for request in alive:
            request.num_failed_steps += 1
            if len(alive) == 1 or request.num_failed_steps >= MAX_FAILED_STEPS:
                self._retire_now(request)
                request.finish("error", error)
                failed.append(request)
            else:
                self._requeue(request)
                request.suspect = True
        return failed

    def _retire_now(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request)


def next_admissible(waiting: deque[Request], failed: list[Request]) -> Request | None:
    """The first waiting request that can start: one without a grammar, or whose grammar
    has compiled. Those behind a grammar still compiling do not wait for it; one whose
    grammar failed to compile is finished with the error and moved to ``failed``."""
    if not waiting or waiting[0].grammar is None:
        return waiting[0] if waiting else None
    for request in list(waiting):
        grammar = request.grammar
        if grammar is None:
            return request
        if not grammar.ready:
            continue
        error = grammar.error
        if error is None:
            return request
        waiting.remove(request)
        request.finish("error", f"{GRAMMAR_FIELD}: the grammar failed to compile: {error}")
        failed.append(request)
    return None
