"""Runs one scheduled step: one flat batch, one forward pass, one batched sample.

The host builds the step's metadata with numpy and copies it once; the device returns the
sampled tokens (and logprobs when asked) with one synchronisation, in ``collect`` — apart
from ``launch``, so the engine can queue the next step before waiting for this one.
``launch`` is ``forward`` then ``sample``: a step whose sampling needs the previous step's
tokens on the host (grammar masks, penalties) has its forward pass queued ahead and its
sampling queued later. A step replays a captured CUDA graph when one holds its shape. A step
that verifies proposals made on the device runs as ``verify_step`` describes, with no more
host work in the way than a plain decode step.

Under tensor parallelism rank 0's runner sends each step's ``StepInputs`` to the other
ranks before its forward pass, and their runners run the same model pass (``run_model``):
the collectives inside it pair up, and only rank 0 samples.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from infer.attention import ScheduledSequence, build_metadata
from infer.cache.kv_tensors import KVTensors
from infer.cache.protocol import CachePoolProtocol
from infer.contract.outputs import TokenLogprob
from infer.distributed.group import SINGLE, ParallelGroup
from infer.engine.core import prompt_logprobs
from infer.engine.core.cuda_graphs import CUDAGraphRunner
from infer.engine.core.prompt_logprobs import PromptScores, ScoredRows
from infer.engine.core.request import Request
from infer.engine.core.sampler import SamplerOutput, SamplingBatch, greedy, sample
from infer.engine.core.scheduler import SchedulerOutput, StepResult
from infer.engine.speculative.token_history import TokenHistory
from infer.engine.speculative.verify_step import (
    VerifyOutputs,
    VerifyPlan,
    empty_inputs,
    load_rows,
    new_rows,
    verify_metadata,
)
from infer.engine.structured.bitmask import Bitmask
from infer.kernels.verify_inputs import ProposalMode, VerifyShape, accept_proposals, verify_inputs
from infer.models import DecoderModel


@dataclass
class LaunchedStep:
    """A step whose kernels are queued: its sampled tokens stay on the device (the next step
    can read them from there) while their copy to the host completes behind ``done``."""

    requests: list[Request]  # the rows that sample, in order
    token_ids: Tensor  # [B] on the device
    # Host copies: tokens (a verify step's: then each row's accepted and proposed counts),
    # logprobs, top ids, top logprobs.
    host: list[Tensor | None]
    done: torch.cuda.Event | None  # None on the CPU, where the copies are already done
    # A verify step: per row, the sample the next step continues from and the proposals
    # accepted (on the device; a plain step continues from ``token_ids``, accepting none).
    continues_from: Tensor | None = None
    accepted: Tensor | None = None
    verify_rows: int = 0


@dataclass
class ForwardedStep:
    """A step whose forward pass is queued but whose sampling is not: ``ModelRunner.sample``
    queues it once the host knows what it reads (the previous step's tokens, for a
    grammar's mask or penalties)."""

    requests: list[Request]  # the rows that sample, in order (a request's proposals: several)
    logits: Tensor  # [B, V] on the device
    output_indices: list[int]  # which output of its request each row samples
    proposed: list[list[int]] | None  # the proposed tokens before each row (speculation)
    verify: VerifyOutputs | None = None  # a verify step's (``verify_step``)


@dataclass
class StepInputs:
    """What a rank needs to run one step's forward pass: the flat batch's sequences (block
    tables, positions, tokens), how many of each one's last positions sample (more than one
    where proposed tokens are checked), whether the input tokens are the
    previous step's samples (still on the device: rank 0 broadcasts them as a tensor), and
    the block copies copy-on-write asked for (made before the step writes the cache)."""

    sequences: list[ScheduledSequence]
    samples: list[int]
    ahead: bool
    copies: list[tuple[int, int]]
    scored: ScoredRows = field(default_factory=ScoredRows)  # prompts scored this step

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.sequences)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as plain tuples: unpickling 256 dataclasses costs a worker ~3x more."""
        rows = [(s.block_table, s.num_computed, s.token_ids) for s in self.sequences]
        return _step_inputs, (rows, self.samples, self.ahead, self.copies, self.scored)


def _step_inputs(
    rows: list[tuple[list[int], int, list[int]]],
    samples: list[int],
    ahead: bool,
    copies: list[tuple[int, int]],
    scored: ScoredRows,
) -> StepInputs:
    return StepInputs([ScheduledSequence(*row) for row in rows], samples, ahead, copies, scored)


class ModelRunner:
    def __init__(
        self,
        model: DecoderModel,
        pool: CachePoolProtocol,
        storage: KVTensors,
        device: torch.device,
        max_seq_len: int,
        graphs: CUDAGraphRunner | None = None,
        group: ParallelGroup = SINGLE,
        long_rows_from: int = 0,
        verify: VerifyShape | None = None,
        history: TokenHistory | None = None,
    ) -> None:
        """``long_rows_from``: eager steps' rows with this many new tokens or more take the
        fused attention path (``attention.long_prefill``; 0: none). ``verify`` and
        ``history``: run verify steps (``verify_step``), recording every step's tokens in
        ``history``."""
        self.model = model
        self.group = group
        self.pool = pool
        self.storage = storage  # the K/V the pool's blocks index
        self.device = device
        self.max_seq_len = max_seq_len
        self.vocab_size = model.config.vocab_size
        self.graphs = graphs
        self.graphed = False  # whether the last step ran in a captured graph (dashboard)
        self.long_rows_from = long_rows_from
        self.verify, self.history = verify, history
        self.proposal_mode = ProposalMode.NGRAM  # where verify steps' proposals come from
        model.bind_kv_cache(storage.k, storage.v)

    def launch(
        self, scheduled: SchedulerOutput, previous: LaunchedStep | None = None
    ) -> LaunchedStep | None:
        """Queue the step's forward pass and sampling; returns None when no row samples.

        A step scheduled ahead takes the input tokens of its fed rows from ``previous``'s
        samples on the device (``scheduled.fed_rows``); the host does not know them yet.
        """
        forwarded = self.forward(scheduled, previous)
        return None if forwarded is None else self.sample(forwarded)

    @torch.inference_mode()
    def forward(
        self, scheduled: SchedulerOutput, previous: LaunchedStep | None = None
    ) -> ForwardedStep | None:
        """Queue the step's forward pass only (``launch`` without sampling)."""
        if scheduled.verify_queries:
            return self._forward_verify(scheduled, previous)
        chunks = scheduled.chunks
        sequences = []
        for chunk in chunks:
            request = chunk.request
            assert request.seq_id is not None
            end = chunk.start + chunk.num_tokens - len(chunk.proposals)
            tokens = request.token_ids[chunk.start : end]
            tokens += [0] * (end - chunk.start - len(tokens))  # placeholders
            tokens += chunk.proposals
            table = self.pool.block_table(request.seq_id)
            sequences.append(ScheduledSequence(table, chunk.start, tokens))
        input_ids = None
        if scheduled.fed_rows:
            assert previous is not None
            input_ids = self._fed_input_ids(sequences, scheduled.fed_rows, previous.token_ids)
        copies = self.pool.take_copies()
        scored, spans = prompt_logprobs.plan(scheduled)
        step = StepInputs(
            sequences, [c.num_samples for c in chunks], input_ids is not None, copies, scored
        )
        if self.group.world_size > 1:
            self.group.broadcast_object(step)
            if input_ids is not None:
                self.group.broadcast_tensor(input_ids)
        logits, scores = self.run_model(step, input_ids)
        if scores is not None:  # waits for this step's forward pass (only where asked)
            prompt_logprobs.record(spans, scores)
        sampling = scheduled.chunks_that_sample()
        if not sampling:
            return None
        if not scheduled.speculative:  # one row per chunk (the usual step: kept lean)
            rows = [c.request for c in sampling]
            return ForwardedStep(rows, logits, [c.output_index for c in sampling], None)
        expanded = [
            (c.request, c.output_index + i, c.proposals[:i])
            for c in sampling
            for i in range(c.num_samples)
        ]
        requests, output_indices, proposed = zip(*expanded, strict=True)
        return ForwardedStep(list(requests), logits, list(output_indices), list(proposed))

    @torch.inference_mode()
    def sample(self, forwarded: ForwardedStep, bitmask: Bitmask | None = None) -> LaunchedStep:
        """Queue the sampling of a forwarded step and the copy of its samples to the host;
        the settings are read from the requests now, the grammars' masks too unless their
        filling was started earlier (``bitmask``)."""
        sampling, logits = forwarded.requests, forwarded.logits
        if forwarded.verify is not None:
            return self._sample_verify(forwarded)
        if all(r.greedy_argmax for r in sampling):  # no settings to gather
            out = greedy(
                logits, sampling, self.vocab_size, self.device, bitmask, forwarded.proposed
            )
        else:
            batch = SamplingBatch.from_requests(
                sampling,
                self.vocab_size,
                self.device,
                bitmask,
                forwarded.output_indices,
                forwarded.proposed,
            )
            out = sample(logits, batch)
        return _copy_to_host(out, sampling)

    def _forward_verify(
        self, scheduled: SchedulerOutput, previous: LaunchedStep | None
    ) -> ForwardedStep:
        """Queue a verify step's forward pass (every chunk a row of ``verify_queries``)."""
        assert self.verify is not None and self.history is not None
        queries, chunks = scheduled.verify_queries, scheduled.chunks
        plan = VerifyPlan([], [], [], [], None, self.proposal_mode)
        for chunk in chunks:
            request = chunk.request
            assert request.seq_id is not None and chunk.verify
            known = chunk.start < request.num_tokens  # else fed from the step in flight
            plan.first.append(request.token_ids[chunk.start] if known else 0)
            plan.base.append(chunk.start)
            plan.limits.append(chunk.proposal_limit)
            plan.tables.append(self.pool.block_table(request.seq_id))
        continued = None
        if scheduled.fed_rows:  # every row, in order (``Scheduler._verify_step``)
            assert previous is not None and len(scheduled.fed_rows) == len(chunks)
            plan.sources = [source for _, source in scheduled.fed_rows]
            samples = previous.continues_from
            continued = (previous.token_ids if samples is None else samples, previous.accepted)
        copies = self.pool.take_copies()
        self.storage.copy_blocks(copies)
        self.history.copy_blocks(copies)
        out = None if self.graphs is None else self.graphs.run_verify(plan, continued)
        self.graphed = out is not None
        if out is None:
            out = self._verify_eagerly(plan, continued, queries)
        logits, verify = out
        requests = [c.request for c in chunks for _ in range(queries)]
        output_indices = [
            c.start + 1 + i - c.request.num_prompt_tokens for c in chunks for i in range(queries)
        ]
        return ForwardedStep(requests, logits, output_indices, None, verify)

    def _verify_eagerly(
        self, plan: VerifyPlan, previous: tuple[Tensor, Tensor | None] | None, queries: int
    ) -> tuple[Tensor, VerifyOutputs]:
        assert self.verify is not None and self.history is not None
        count, width = len(plan.tables), max(len(t) for t in plan.tables)
        rows, extra = new_rows(count, self.device)
        block_tables = torch.empty(count, width, dtype=torch.int32, device=self.device)
        load_rows(plan, previous, rows, extra, block_tables)
        inputs = empty_inputs(count, queries, self.device)
        verify_inputs(
            inputs, rows, block_tables, self.history.ids, self.verify, self.pool.block_size
        )
        self.history.write(inputs.input_ids, inputs.slot_mapping)
        meta = verify_metadata(inputs, rows, block_tables, queries, self.max_seq_len)
        logits = self.model.compute_logits(self.model(inputs.input_ids, meta))
        return logits, VerifyOutputs(inputs.input_ids, inputs.num_proposals, extra, queries)

    def _sample_verify(self, forwarded: ForwardedStep) -> LaunchedStep:
        """Sample every token of a verify step, then count on the device what stands; the
        samples, accepted and proposed counts go to the host in one copy."""
        verify, sampling, logits = forwarded.verify, forwarded.requests, forwarded.logits
        assert verify is not None
        tokens = len(sampling)
        packed = torch.empty(
            tokens + 2 * (tokens // verify.queries), dtype=torch.int64, device=self.device
        )
        if all(r.greedy_argmax for r in sampling):
            out = SamplerOutput(torch.argmax(logits, dim=-1, out=packed[:tokens]))
        else:
            batch = SamplingBatch.from_requests(
                sampling, self.vocab_size, self.device, None, forwarded.output_indices
            )
            # A seeded row's noise follows the output it samples, which the device knows.
            batch.rows.steps = batch.rows.steps + verify.extra.repeat_interleave(verify.queries)
            out = sample(logits, batch)
        continues_from = accept_proposals(
            out.token_ids, verify.input_ids, verify.num_proposals, verify.queries, packed
        )
        out.token_ids = packed
        launched = _copy_to_host(out, sampling)
        launched.token_ids = packed[:tokens]
        launched.continues_from = continues_from
        launched.accepted = packed[tokens : tokens + tokens // verify.queries]
        launched.verify_rows = tokens // verify.queries
        return launched

    def _fed_input_ids(
        self, sequences: list[ScheduledSequence], fed: list[tuple[int, int]], samples: Tensor
    ) -> Tensor:
        """The step's input tokens on the device, the fed rows' (one token each) taken from
        the samples of the step in flight."""
        rows, picks = zip(*fed, strict=True)
        picked = samples[torch.tensor(picks, dtype=torch.int64).to(self.device, non_blocking=True)]
        if len(fed) == len(sequences):
            return picked  # every row fed (one token each), in order
        ends = _ends(sequences)
        positions = torch.tensor([ends[row] - 1 for row in rows], dtype=torch.int64)
        host_ids = torch.tensor([t for s in sequences for t in s.token_ids], dtype=torch.int64)
        input_ids = host_ids.to(self.device, non_blocking=True)
        input_ids[positions.to(self.device, non_blocking=True)] = picked
        return input_ids

    def is_done(self, launched: LaunchedStep | None) -> bool:
        """Whether the step's samples are on the host already (collecting would not wait)."""
        return launched is None or launched.done is None or launched.done.query()

    def collect(self, launched: LaunchedStep | None) -> StepResult:
        """Wait for the step's samples and return them (the step's one synchronisation)."""
        if launched is None:  # no row sampled
            return StepResult([], [])
        if launched.done is not None:
            launched.done.synchronize()
        return _results(launched)

    def release_graphs(self) -> None:
        """Drop the CUDA graphs before the process group goes: destroying an NCCL group
        whose collectives a live graph captured can hang (pytorch/pytorch#115388)."""
        if self.graphs is not None:
            self.graphs = None
            gc.collect()
            torch.cuda.synchronize()

    def run_model(
        self, step: StepInputs, input_ids: Tensor | None
    ) -> tuple[Tensor, PromptScores | None]:
        """Logits of the step's sampling rows, and the scores of its scored prompt tokens
        (None when none are); ``input_ids`` (on the device) overrides the sequences' tokens.
        A captured graph runs the step when one holds it."""
        sequences, samples = step.sequences, step.samples
        self.storage.copy_blocks(step.copies)  # every rank: each holds its share of the heads
        if self.history is not None:
            self.history.copy_blocks(step.copies)
        decode = all(len(s.token_ids) == 1 for s in sequences)
        out = None if self.graphs is None else self.graphs.run(sequences, input_ids)
        self.graphed = out is not None
        if out is None:
            host_ids, meta = build_metadata(
                sequences, self.pool.block_size, self.device, self.long_rows_from
            )
            tokens = host_ids if input_ids is None else input_ids
            if self.history is not None:
                self.history.write(tokens, meta.slot_mapping)
            out = self.model(tokens, meta)
            if decode:
                out = self.model.compute_logits(out)

        # A decode step's ``out`` holds every row's logits (one token per row), any other
        # step's every token's hidden state (a sequence samples from its last token).
        computed: Tensor = out

        def logits_of(flat: Tensor) -> Tensor:
            return computed[flat] if decode else self.model.compute_logits(computed[flat])

        scores = None
        if step.scored.positions:
            scores = prompt_logprobs.score(step.scored, logits_of, self.device)
        if decode and all(samples):
            return out, scores
        if decode:
            rows = [i for i, count in enumerate(samples) if count]
        else:
            ends = _ends(sequences)
            rows = [p for end, n in zip(ends, samples) for p in range(end - n, end)]
        index = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        return logits_of(index), scores


def _ends(sequences: list[ScheduledSequence]) -> list[int]:
    ends, total = [], 0
    for s in sequences:
        total += len(s.token_ids)
        ends.append(total)
    return ends


def _copy_to_host(out: SamplerOutput, requests: list[Request]) -> LaunchedStep:
    """Queue the copies of the sampler's results into pinned host memory."""
    tensors = [out.token_ids, out.logprobs, out.top_ids, out.top_logprobs]
    if not out.token_ids.is_cuda:
        return LaunchedStep(requests, out.token_ids, list(tensors), None)
    host: list[Tensor | None] = []
    for tensor in tensors:
        if tensor is None:
            host.append(None)
            continue
        buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.append(buffer.copy_(tensor, non_blocking=True))
    done = torch.cuda.Event()
    done.record()
    return LaunchedStep(requests, out.token_ids, host, done)


def _results(launched: LaunchedStep) -> StepResult:
    tokens, chosen, top_ids, top_values = launched.host
    assert tokens is not None
    token_ids: list[int] = tokens.tolist()
    accepted = num_proposals = None
    if launched.verify_rows:  # samples, then each row's accepted and proposed counts
        rows = launched.verify_rows
        token_ids, accepted, num_proposals = (
            token_ids[: -2 * rows],
            token_ids[-2 * rows : -rows],
            token_ids[-rows:],
        )
    if chosen is None:
        return StepResult(token_ids, [None] * len(token_ids), accepted, num_proposals)
    chosen_list = chosen.tolist()
    ids = top_ids.tolist() if top_ids is not None else [[] for _ in token_ids]
    values = top_values.tolist() if top_values is not None else [[] for _ in token_ids]
    logprobs: list[TokenLogprob | None] = []
    for i, request in enumerate(launched.requests):
        wanted = request.params.logprobs
        if wanted is None:
            logprobs.append(None)
            continue
        top = dict(zip(ids[i][:wanted], values[i][:wanted]))
        logprobs.append(TokenLogprob(token_ids[i], chosen_list[i], top))
    return StepResult(token_ids, logprobs, accepted, num_proposals)
