"""Runs one scheduled ``Step``: one flat batch, one forward pass, one batched sample.

``launch`` queues the step's forward pass (the host builds its metadata with numpy and
copies it once), ``sample`` its sampling and the copy of the samples to the host, and
``collect`` waits for them: the step's one synchronisation, apart from the other two, so the
engine can queue the next step before waiting for this one. A step whose sampling needs the
previous step's tokens on the host (grammar masks, penalties) is launched ahead and sampled
later. Each fills its part of the step (``step.Step``). A step replays a captured CUDA graph
when one holds its shape. A step that verifies proposals made on the device runs as
``verify_step`` describes, with no more host work in the way than a plain decode step.

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
from infer.engine.core.sampler import SamplerOutput, SamplingBatch, greedy, sample
from infer.engine.core.step import Step
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
from infer.kernels.argmax import argmax_rows
from infer.kernels.verify_inputs import ProposalMode, VerifyShape, accept_proposals, verify_inputs
from infer.models import DecoderModel


@dataclass
class StepInputs:
    """What a rank needs to run one step's forward pass (``launch`` makes it of a ``Step``;
    under tensor parallelism rank 0 sends it to the other ranks): the flat batch's sequences
    (block tables, positions, tokens), how many of each one's last positions sample (more
    than one where proposed tokens are checked), whether the input tokens are the previous
    step's samples (still on the device: rank 0 broadcasts them as a tensor), and the block
    copies copy-on-write asked for (made before the step writes the cache)."""

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

    @torch.inference_mode()
    def launch(self, step: Step, previous: Step | None = None) -> None:
        """Queue the step's forward pass; the logits of its rows that sample stay on the
        device (``step.logits``) for ``sample``. A step scheduled ahead takes the input
        tokens of its fed rows from ``previous``'s samples on the device
        (``step.fed_rows``); the host does not know them yet."""
        if step.verify_queries:
            self._launch_verify(step, previous)
            return
        chunks = step.chunks
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
        if step.fed_rows:
            assert previous is not None and previous.samples is not None
            input_ids = self._fed_input_ids(sequences, step.fed_rows, previous.samples)
        copies = self.pool.take_copies()
        scored, spans = prompt_logprobs.plan(step)
        inputs = StepInputs(
            sequences, [c.num_samples for c in chunks], input_ids is not None, copies, scored
        )
        if self.group.world_size > 1:
            self.group.broadcast_object(inputs)
            if input_ids is not None:
                self.group.broadcast_tensor(input_ids)
        logits, scores = self.run_model(inputs, input_ids)
        if scores is not None:  # waits for this step's forward pass (only where asked)
            prompt_logprobs.record(spans, scores)
        sampling = step.chunks_that_sample()
        if not sampling:
            return
        step.logits = logits
        if not step.speculative:  # one row per chunk (the usual step: kept lean)
            step.rows = [c.request for c in sampling]
            step.output_indices = [c.output_index for c in sampling]
            return
        expanded = [
            (c.request, c.output_index + i, c.proposals[:i])
            for c in sampling
            for i in range(c.num_samples)
        ]
        requests, output_indices, proposed = zip(*expanded, strict=True)
        step.rows, step.output_indices = list(requests), list(output_indices)
        step.proposed = list(proposed)

    @torch.inference_mode()
    def sample(self, step: Step, bitmask: Bitmask | None = None) -> None:
        """Queue the sampling of a launched step and the copy of its samples to the host
        (nothing when no row samples); the settings are read from the requests now, the
        grammars' masks too unless their filling was started earlier (``bitmask``)."""
        logits, sampling = step.logits, step.rows
        if logits is None:
            return
        step.logits = None  # (the samples are what a later step reads)
        if step.verify is not None:
            self._sample_verify(step, logits)
            return
        if all(r.greedy_argmax for r in sampling):  # no settings to gather
            out = greedy(logits, sampling, self.vocab_size, self.device, bitmask, step.proposed)
        else:
            batch = SamplingBatch.from_requests(
                sampling,
                self.vocab_size,
                self.device,
                bitmask,
                step.output_indices,
                step.proposed,
            )
            out = sample(logits, batch)
        _copy_to_host(step, out)

    def _launch_verify(self, step: Step, previous: Step | None) -> None:
        """Queue a verify step's forward pass (every chunk a row of ``verify_queries``)."""
        assert self.verify is not None and self.history is not None
        queries, chunks = step.verify_queries, step.chunks
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
        if step.fed_rows:  # every row, in order (``Scheduler._verify_step``)
            assert previous is not None and len(step.fed_rows) == len(chunks)
            assert previous.samples is not None
            plan.sources = [source for _, source in step.fed_rows]
            samples = previous.continues_from
            continued = (
                previous.samples if samples is None else samples,
                previous.accepted_on_device,
            )
        copies = self.pool.take_copies()
        self.storage.copy_blocks(copies)
        self.history.copy_blocks(copies)
        out = None if self.graphs is None else self.graphs.run_verify(plan, continued)
        self.graphed = out is not None
        if out is None:
            out = self._verify_eagerly(plan, continued, queries)
        step.logits, step.verify = out
        step.rows = [c.request for c in chunks for _ in range(queries)]
        step.output_indices = [
            c.start + 1 + i - c.request.num_prompt_tokens for c in chunks for i in range(queries)
        ]

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

    def _sample_verify(self, step: Step, logits: Tensor) -> None:
        """Sample every token of a verify step, then count on the device what stands; the
        samples, accepted and proposed counts go to the host in one copy."""
        verify, sampling = step.verify, step.rows
        assert verify is not None
        step.verify = None
        tokens = len(sampling)
        packed = torch.empty(
            tokens + 2 * (tokens // verify.queries), dtype=torch.int64, device=self.device
        )
        if all(r.greedy_argmax for r in sampling):
            out = SamplerOutput(argmax_rows(logits, out=packed[:tokens]))
        else:
            batch = SamplingBatch.from_requests(
                sampling, self.vocab_size, self.device, None, step.output_indices
            )
            # A seeded row's noise follows the output it samples, which the device knows.
            batch.rows.steps = batch.rows.steps + verify.extra.repeat_interleave(verify.queries)
            out = sample(logits, batch)
        continues_from = accept_proposals(
            out.token_ids, verify.input_ids, verify.num_proposals, verify.queries, packed
        )
        out.token_ids = packed
        _copy_to_host(step, out)
        step.samples = packed[:tokens]
        step.continues_from = continues_from
        step.accepted_on_device = packed[tokens : tokens + tokens // verify.queries]

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

    def is_done(self, step: Step) -> bool:
        """Whether the step's samples are on the host already (collecting would not wait)."""
        return step.done is None or step.done.query()

    def collect(self, step: Step) -> None:
        """Wait for the step's samples and put them on it (``token_ids``, ``logprobs``, a
        verify step's counts): the step's one synchronisation."""
        if step.samples is None:  # no row sampled
            return
        if step.done is not None:
            step.done.synchronize()
        _collected(step)

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


def _copy_to_host(step: Step, out: SamplerOutput) -> None:
    """Keep the samples on the device and queue their copies into pinned host memory."""
    step.samples = out.token_ids
    tensors = [out.token_ids, out.logprobs, out.top_ids, out.top_logprobs]
    if not out.token_ids.is_cuda:
        step.host = list(tensors)
        return
    host: list[Tensor | None] = []
    for tensor in tensors:
        if tensor is None:
            host.append(None)
            continue
        buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.append(buffer.copy_(tensor, non_blocking=True))
    done = torch.cuda.Event()
    done.record()
    step.host, step.done = host, done


def _collected(step: Step) -> None:
    """Read the host copies into the step's ``token_ids``, ``logprobs`` and a verify
    step's counts."""
    tokens, chosen, top_ids, top_values = step.host
    assert tokens is not None
    token_ids: list[int] = tokens.tolist()
    if step.verify_queries:  # samples, then each row's accepted and proposed counts
        rows = len(step.chunks)
        token_ids, step.accepted, step.num_proposals = (
            token_ids[: -2 * rows],
            token_ids[-2 * rows : -rows],
            token_ids[-rows:],
        )
    step.token_ids = token_ids
    if chosen is None:
        step.logprobs = [None] * len(token_ids)
        return
    chosen_list = chosen.tolist()
    ids = top_ids.tolist() if top_ids is not None else [[] for _ in token_ids]
    values = top_values.tolist() if top_values is not None else [[] for _ in token_ids]
    logprobs: list[TokenLogprob | None] = []
    for i, request in enumerate(step.rows):
        wanted = request.params.logprobs
        if wanted is None:
            logprobs.append(None)
            continue
        top = dict(zip(ids[i][:wanted], values[i][:wanted]))
        logprobs.append(TokenLogprob(token_ids[i], chosen_list[i], top))
    step.logprobs = logprobs
