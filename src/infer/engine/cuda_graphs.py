"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step launches the same kernels every time with only the data changing, so its
launches are captured once per bucket and replayed with one call. Inputs live in static
buffers; a batch is padded to its bucket with rows that write nowhere (slot -1) and read one
position. The attention kernels loop to each row's actual ``seq_len`` read on the device,
so a graph captured once serves any context length up to ``max_seq_len``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from infer.attention import AttentionMetadata, ScheduledSequence
from infer.attention.metadata import host_batch
from infer.models import DecoderModel


def graph_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16: little padding, a bounded number of graphs."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch_size]
    sizes += list(range(16, max_batch_size, 16))
    return [*sizes, max_batch_size]


def padded_batch_size(batch_size: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds ``batch_size`` rows; None if it exceeds them all."""
    for bucket in buckets:
        if bucket >= batch_size:
            return bucket
    return None


class CUDAGraphRunner:
    def __init__(
        self,
        model: DecoderModel,
        block_size: int,
        max_batch_size: int,
        max_seq_len: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.max_seq_len = max_seq_len
        self.buckets = graph_buckets(max_batch_size)
        self.table_width = math.ceil(max_seq_len / block_size)
        rows = self.buckets[-1]
        self._staging = torch.zeros(rows * (4 + self.table_width), dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(rows, self.table_width, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.memory_bytes = 0

    def _metadata(self, rows: int) -> AttentionMetadata:
        return AttentionMetadata(
            positions=self.positions[:rows],
            slot_mapping=self.slot_mapping[:rows],
            block_tables=self.block_tables[:rows],
            seq_lens=self.seq_lens[:rows],
            query_start_loc=self.query_start_loc[: rows + 1],
            max_query_len=1,
            max_seq_len=self.max_seq_len,
        )

    def _forward(self, rows: int) -> Tensor:
        hidden = self.model(self.input_ids[:rows], self.positions[:rows], self._metadata(rows))
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool."""
        before = torch.cuda.memory_allocated()
        pool = torch.cuda.graph_pool_handle()
        for rows in reversed(self.buckets):
            for _ in range(2):  # compile and autotune kernels outside the capture
                self._forward(rows)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(rows)
            self._graphs[rows] = (graph, logits)
        torch.cuda.synchronize()
        self.memory_bytes = torch.cuda.memory_allocated() - before

    def run(
        self, sequences: list[ScheduledSequence], input_ids: Tensor | None = None
    ) -> Tensor | None:
        """Logits ``[B, V]`` of a decode-only step, or None when no bucket fits.

        ``input_ids`` (on the device) overrides the sequences' tokens (see ``ModelRunner``).
        """
        rows = padded_batch_size(len(sequences), self.buckets)
        if rows is None or rows not in self._graphs:
            return None
        host = host_batch(sequences, self.block_size, rows, self.table_width)
        packed = np.concatenate(
            [
                host.input_ids,
                host.positions,
                host.slot_mapping,
                host.seq_lens,
                host.block_tables.ravel(),
            ]
        )
        staged = self._staging[: packed.size]
        staged.copy_(torch.from_numpy(packed), non_blocking=True)
        self.input_ids[:rows].copy_(staged[:rows])
        if input_ids is not None:
            self.input_ids[: len(sequences)].copy_(input_ids)
        self.positions[:rows].copy_(staged[rows : 2 * rows])
        self.slot_mapping[:rows].copy_(staged[2 * rows : 3 * rows])
        self.seq_lens[:rows].copy_(staged[3 * rows : 4 * rows])
        self.block_tables[:rows].copy_(staged[4 * rows :].view(rows, -1))
        graph, logits = self._graphs[rows]
        graph.replay()
        return logits[: len(sequences)]
