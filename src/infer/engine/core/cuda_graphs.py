"""Steps replayed from CUDA graphs: decode steps by batch size, every other step by token count.

A step launches the same kernels every time with only the data changing, so its launches are
captured once per shape bucket and replayed with one call, without the per-layer Python and
launch cost of an eager forward. Inputs live in static buffers. A step is padded to its
bucket with rows that hold no tokens (their attention programs exit at once) and tokens that
belong to no row and are written nowhere (slot -1). The attention kernels read every length
on the device and size their grids from the bucket, so one graph serves any mix of prompt
chunks, cached prefixes and decode rows at any context length up to ``max_seq_len``.

* Decode graphs (every row one token; batch sizes 1, 2, 4, 8, then multiples of 16) end at
  the logits of all rows: every row samples. Past 2 rows each size has a second graph whose
  keys split more, for steps with a long context (``LONG_DECODE_CONTEXT``).
* Mixed graphs (token counts 16, 32, 64, 128, then multiples of 128 up to
  ``max_graph_tokens``; rows up to ``min(tokens, max_batch_size)``) end at the final hidden
  states: how many rows sample varies, so the runner picks and projects them outside.
* Verify graphs (``verify_step``; the decode sizes whose rows x Q tokens fit
  ``MAX_VERIFY_TOKENS``) make their inputs on the device first, then end at the logits of
  every token (each samples). ``verify_costs`` times them against the decode graphs. They
  have no long-context variant: their keys split for all their rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from infer.attention import AttentionMetadata, ScheduledSequence
from infer.attention.metadata import HostBatch, host_batch
from infer.engine.speculative.token_history import TokenHistory
from infer.engine.speculative.verify_step import (
    MAX_VERIFY_TOKENS,
    VerifyOutputs,
    VerifyPlan,
    load_rows,
    row_layout,
)
from infer.kernels.verify_inputs import RowStarts, VerifyInputs, VerifyShape, verify_inputs
from infer.models import DecoderModel

# A mixed graph's grid splits keys as for this many decode rows, not for all its rows (mostly
# prompt and padding rows): a few long-context decode rows beside a prompt chunk would
# otherwise run one program per (row, KV head) over all their keys (benchmarks/
# results-by-topic/06-prefill-caching.md, 6.1). A step with more decode rows splits each less
# (the kernel reads how many it holds).
MIXED_SPLIT_ROWS = 8
# A decode step whose longest context reaches LONG_DECODE_CONTEXT tokens replays a graph of
# its size whose keys split as for LONG_DECODE_SPLIT_ROWS rows: split for all its rows, a
# long row's keys would be walked by one program per KV head, ~0.4 ms a layer at 16k. Every
# row of such a step takes that many pieces: long rows' steps ran faster split as for two
# rows than as for four, and no slower than as for one
# (benchmarks/results-by-topic/14-long-context.md, 14.10).
LONG_DECODE_CONTEXT = 4096
LONG_DECODE_SPLIT_ROWS = 2


@dataclass(frozen=True)
class Bucket:
    """One captured shape: ``tokens`` token rows over ``rows`` sequence rows (a verify
    bucket: ``queries`` tokens each); ``long``: a decode bucket for steps with a long context
    (keys split for ``LONG_DECODE_SPLIT_ROWS``)."""

    tokens: int
    rows: int
    decode: bool
    queries: int = 0
    long: bool = False


def decode_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16: little padding, a bounded number of graphs."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch_size]
    sizes += list(range(16, max_batch_size, 16))
    return [*sizes, max_batch_size]


def mixed_sizes(max_tokens: int) -> list[int]:
    """16, 32, 64, 128, then every multiple of 128: a 512-token chunk beside up to 256
    decode rows pads by at most 127 tokens."""
    sizes = [t for t in (16, 32, 64) if t < max_tokens]
    sizes += list(range(128, max_tokens, 128))
    return [*sizes, max_tokens]


def verify_sizes(max_batch_size: int, queries: int) -> list[int]:
    """The decode sizes whose rows of ``queries`` tokens fit ``MAX_VERIFY_TOKENS``."""
    return [rows for rows in decode_sizes(max_batch_size) if rows * queries <= MAX_VERIFY_TOKENS]


def smallest_fitting(sizes: list[int], wanted: int) -> int | None:
    """The smallest size that holds ``wanted``; None if it exceeds them all."""
    return next((size for size in sizes if size >= wanted), None)


class CUDAGraphRunner:
    def __init__(
        self,
        model: DecoderModel,
        block_size: int,
        max_batch_size: int,
        max_seq_len: int,
        max_graph_tokens: int,
        device: torch.device,
        verify: VerifyShape | None = None,
        history: TokenHistory | None = None,
    ) -> None:
        """``verify`` (with the ``history`` its lookups read): also capture verify steps."""
        self.model = model
        self.block_size = block_size
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.decode_sizes = decode_sizes(max_batch_size)
        self.mixed_sizes = mixed_sizes(max_graph_tokens) if max_graph_tokens > 1 else []
        self.verify, self.history = verify, history
        self.verify_sizes = [] if verify is None else verify_sizes(max_batch_size, verify.queries)
        self.table_width = math.ceil(max_seq_len / block_size)
        tokens = max(max_batch_size, max_graph_tokens, MAX_VERIFY_TOKENS if verify else 0)
        rows = max_batch_size
        self._staging = torch.zeros(
            HostBatch.packed_size(tokens, rows, self.table_width), dtype=torch.int64, device=device
        )
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((tokens,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(rows, self.table_width, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.query_start_loc = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.row_order = torch.zeros(rows, dtype=torch.int32, device=device)
        self.row_counts = torch.zeros(2, dtype=torch.int32, device=device)
        self.token_rows = torch.full((tokens,), -1, dtype=torch.int32, device=device)
        int64 = torch.int64
        self.spec = RowStarts(  # a verify step's rows (``verify_step.plan_rows``)
            first=torch.zeros(rows, dtype=int64, device=device),
            base=torch.zeros(rows, dtype=int64, device=device),
            limit=torch.zeros(rows, dtype=torch.int32, device=device),
            mode=torch.zeros(1, dtype=torch.int32, device=device),
            given=torch.zeros(rows, 1, dtype=int64, device=device),
            num_rows=self.row_counts,
        )
        self.num_proposals = torch.zeros(rows, dtype=torch.int32, device=device)
        self.extra = torch.zeros(rows, dtype=int64, device=device)
        self._graphs: dict[Bucket, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.memory_bytes = 0
        # Verify step / decode step time by rows, from empty replays (``measure_verify_costs``).
        self.verify_costs: dict[int, float] = {}

    @property
    def buckets(self) -> list[Bucket]:
        decode = [Bucket(size, size, True) for size in self.decode_sizes]
        if self.max_seq_len >= LONG_DECODE_CONTEXT:  # (fewer rows already split as much)
            decode += [Bucket(b.tokens, b.rows, True, long=True) for b in decode if _splits_more(b)]
        mixed = [Bucket(t, min(t, self.max_batch_size), False) for t in self.mixed_sizes]
        queries = 0 if self.verify is None else self.verify.queries
        verify = [
            Bucket(rows * queries, rows, False, queries=queries) for rows in self.verify_sizes
        ]
        return decode + mixed + verify

    def bucket_for(self, sequences: list[ScheduledSequence]) -> Bucket | None:
        """The bucket a step runs in; None when it is larger than every captured one."""
        if all(len(s.token_ids) == 1 for s in sequences):
            size = smallest_fitting(self.decode_sizes, len(sequences))
            if size is None:
                return None
            bucket = Bucket(size, size, True)
            longest = max(s.num_computed for s in sequences) + 1
            if longest >= LONG_DECODE_CONTEXT and _splits_more(bucket):
                return Bucket(size, size, True, long=True)
            return bucket
        tokens = smallest_fitting(self.mixed_sizes, sum(len(s.token_ids) for s in sequences))
        if tokens is None or len(sequences) > min(tokens, self.max_batch_size):
            return None
        return Bucket(tokens, min(tokens, self.max_batch_size), False)

    def load(
        self, bucket: Bucket, sequences: list[ScheduledSequence], input_ids: Tensor | None = None
    ) -> None:
        """Copy a step's inputs into the static buffers (one host-to-device transfer).

        ``input_ids`` (on the device) overrides the sequences' tokens (see ``ModelRunner``).
        """
        tokens, rows, count = bucket.tokens, bucket.rows, len(sequences)
        host = host_batch(sequences, self.block_size, rows, tokens)
        width = host.block_tables.shape[1]
        for name, staged in host.to_device(self._staging.device, self._staging).items():
            if name == "block_tables":
                self.block_tables[:count, :width].copy_(staged.view(count, width))
            else:
                getattr(self, name)[: staged.numel()].copy_(staged)
        if input_ids is not None:
            self.input_ids[: input_ids.shape[0]].copy_(input_ids)

    def forward(self, bucket: Bucket) -> Tensor:
        """The step a bucket's graph captures, run on the static buffers: logits ``[rows,
        vocab]`` of a decode bucket, ``[tokens, vocab]`` of a verify one, hidden states
        ``[tokens, hidden]`` of a mixed one."""
        tokens, rows = bucket.tokens, bucket.rows
        if bucket.queries:
            return self._forward_verify(bucket)
        meta = AttentionMetadata(
            positions=self.positions[:tokens],
            slot_mapping=self.slot_mapping[:tokens],
            block_tables=self.block_tables[:rows],
            seq_lens=self.seq_lens[:rows],
            query_start_loc=self.query_start_loc[: rows + 1],
            max_query_len=1 if bucket.decode else tokens,
            max_seq_len=self.max_seq_len,
            split_rows=_split_rows(bucket),
            row_order=self.row_order[:rows],
            row_counts=self.row_counts,
            token_rows=self.token_rows[:tokens],
        )
        if self.history is not None:
            self.history.write(self.input_ids[:tokens], self.slot_mapping[:tokens])
        hidden = self.model(self.input_ids[:tokens], meta)
        return self.model.compute_logits(hidden) if bucket.decode else hidden

    def _forward_verify(self, bucket: Bucket) -> Tensor:
        assert self.verify is not None and self.history is not None
        tokens, rows, queries = bucket.tokens, bucket.rows, bucket.queries
        spec = self.spec
        inputs = VerifyInputs(
            self.input_ids[:tokens],
            self.positions[:tokens],
            self.slot_mapping[:tokens],
            self.seq_lens[:rows],
            self.num_proposals[:rows],
        )
        verify_inputs(
            inputs,
            RowStarts(
                spec.first[:rows], spec.base[:rows], spec.limit[:rows], spec.mode,
                spec.given[:rows], spec.num_rows,
            ),
            self.block_tables[:rows],
            self.history.ids,
            self.verify,
            self.block_size,
        )  # fmt: skip
        self.history.write(inputs.input_ids, inputs.slot_mapping)
        starts, order, owners = row_layout(self.row_counts, rows, queries)
        meta = AttentionMetadata(
            positions=inputs.positions,
            slot_mapping=inputs.slot_mapping,
            block_tables=self.block_tables[:rows],
            seq_lens=inputs.seq_lens,
            query_start_loc=starts,
            max_query_len=queries,
            max_seq_len=self.max_seq_len,
            decode_queries=queries,
            row_order=order,
            row_counts=self.row_counts,
            token_rows=owners,
        )
        return self.model.compute_logits(self.model(inputs.input_ids, meta))

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool, and replay each
        once. The static buffers hold rows without tokens meanwhile, so the warm-up runs and
        the replays write nothing."""
        before = torch.cuda.memory_allocated()
        pool = torch.cuda.graph_pool_handle()
        buckets = sorted(self.buckets, key=lambda b: (b.decode, b.tokens, b.long), reverse=True)
        for bucket in buckets:
            for _ in range(2):  # compile and autotune kernels outside the capture
                self.forward(bucket)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.forward(bucket)
            self._graphs[bucket] = (graph, out)
        # A graph's first replay uploads it to the device; done here, the first requests do
        # not wait for it (nothing is written: the buffers still hold rows without tokens).
        for graph, _ in self._graphs.values():
            graph.replay()
        torch.cuda.synchronize()
        self.memory_bytes = torch.cuda.memory_allocated() - before

    def run_verify(
        self, plan: VerifyPlan, previous: tuple[Tensor, Tensor | None] | None
    ) -> tuple[Tensor, VerifyOutputs] | None:
        """Replay the verify graph of ``plan``'s rows (``verify_step.load_rows``): logits
        ``[R * Q, vocab]`` and what sampling them needs; None when no captured bucket holds
        the rows."""
        bucket = self.verify_bucket(len(plan.tables))
        if bucket is None or bucket not in self._graphs:
            return None
        self.load_verify(plan, previous)
        graph, logits = self._graphs[bucket]
        graph.replay()
        return logits[: bucket.queries * len(plan.tables)], self.verify_outputs(len(plan.tables))

    def verify_bucket(self, count: int) -> Bucket | None:
        """The verify bucket of ``count`` rows; None when none holds them."""
        size = smallest_fitting(self.verify_sizes, count)
        if self.verify is None or size is None:
            return None
        queries = self.verify.queries
        return Bucket(size * queries, size, False, queries=queries)

    def load_verify(self, plan: VerifyPlan, previous: tuple[Tensor, Tensor | None] | None) -> None:
        """Copy a verify step's rows into the static buffers (``verify_step.load_rows``)."""
        count, spec = len(plan.tables), self.spec
        rows = RowStarts(
            spec.first[:count], spec.base[:count], spec.limit[:count], spec.mode,
            spec.given[:count], spec.num_rows,
        )  # fmt: skip
        load_rows(plan, previous, rows, self.extra[:count], self.block_tables, self._staging)

    def verify_outputs(self, count: int) -> VerifyOutputs:
        """The static buffers a verify step of ``count`` rows leaves for its sampling."""
        assert self.verify is not None
        queries = self.verify.queries
        return VerifyOutputs(
            self.input_ids[: count * queries], self.num_proposals[:count], self.extra[:count],
            queries,
        )  # fmt: skip

    @torch.inference_mode()
    def measure_verify_costs(self, repeats: int = 10) -> None:
        """Each verify bucket's replay time over the decode bucket's of as many rows, with no
        rows in them (the weights read either way, what a short context's step costs)."""
        self.verify_costs = {}
        self.seq_lens.zero_()
        self.query_start_loc.zero_()
        self.row_counts.zero_()
        self.slot_mapping.fill_(-1)
        for rows in self.verify_sizes:
            verify = self._graphs.get(self.verify_bucket(rows))  # type: ignore[arg-type]
            decode = self._graphs.get(Bucket(rows, rows, True))
            if verify is None or decode is None:
                continue
            times = [replay_ms(graph, repeats) for graph, _ in (decode, verify, decode, verify)]
            self.verify_costs[rows] = (times[1] + times[3]) / (times[0] + times[2])

    def run(
        self, sequences: list[ScheduledSequence], input_ids: Tensor | None = None
    ) -> Tensor | None:
        """Replay the step's graph: logits ``[B, vocab]`` of a decode step, hidden states
        ``[T, hidden]`` of any other; None when no captured bucket holds the step."""
        bucket = self.bucket_for(sequences)
        if bucket is None or bucket not in self._graphs:
            return None
        self.load(bucket, sequences, input_ids)
        graph, out = self._graphs[bucket]
        graph.replay()
        return out[: len(sequences)] if bucket.decode else out[: _num_tokens(sequences)]


def replay_ms(graph: torch.cuda.CUDAGraph, repeats: int, warmups: int = 1) -> float:
    """GPU milliseconds of one replay of ``graph``, the mean of ``repeats`` after
    ``warmups`` (CUDA events)."""
    for _ in range(warmups):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def _split_rows(bucket: Bucket) -> int | None:
    """The decode rows a bucket's keys are split for (None: all its rows)."""
    if bucket.long:
        return LONG_DECODE_SPLIT_ROWS
    return None if bucket.decode else min(bucket.rows, MIXED_SPLIT_ROWS)


def _splits_more(bucket: Bucket) -> bool:
    """Whether a decode bucket's long variant splits keys more than the bucket itself."""
    return bucket.rows > LONG_DECODE_SPLIT_ROWS


def _num_tokens(sequences: list[ScheduledSequence]) -> int:
    return sum(len(s.token_ids) for s in sequences)
