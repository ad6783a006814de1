"""The flat ragged batch every attention layer of one step reads.

All sequences' new tokens are concatenated (``T`` tokens); sequence ``b`` owns query rows
``query_start_loc[b]:query_start_loc[b+1]`` and, after this step, ``seq_lens[b]`` tokens of
context in the blocks listed by ``block_tables[b]``. Its queries sit at the last positions of
that context, so prefill, a prefill chunk, a prefix-cached prefill and a decode token are the
same case with different lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from infer.kernels.ragged_batch import RaggedBatch

if TYPE_CHECKING:
    from infer.attention.long_prefill import LongPrefill


@dataclass
class AttentionMetadata(RaggedBatch):
    """What the kernels read (``RaggedBatch``: block tables, lengths, query offsets), plus
    where this step's tokens sit and go."""

    positions: Tensor = field(kw_only=True)  # [T] int64, absolute position of each new token
    # [T] int64, where each new token's K/V is written; -1 = nowhere
    slot_mapping: Tensor = field(kw_only=True)
    # Per-step values derived once and shared by all layers (e.g. the torch backend's plan).
    derived: dict[str, Any] = field(default_factory=dict, kw_only=True)
    # Rows that run torch's fused attention instead of the Triton kernels (eager steps).
    long_prefill: LongPrefill | None = field(default=None, kw_only=True)


@dataclass
class ScheduledSequence:
    """One sequence's part of a step: which blocks it owns and which tokens run now."""

    block_table: list[int]
    num_computed: int  # tokens whose K/V is already in the cache
    token_ids: list[int]  # the tokens computed in this step


@dataclass
class HostBatch:
    """A step's inputs as host arrays, before their single copy to the device."""

    input_ids: np.ndarray  # [T], padding tokens included
    positions: np.ndarray  # [T]
    slot_mapping: np.ndarray  # [T]
    block_tables: np.ndarray  # [B, W], the real rows only
    seq_lens: np.ndarray  # [R], padding rows included
    query_start_loc: np.ndarray  # [R + 1]
    row_order: np.ndarray  # [R]: decode rows, prefill rows, then rows without tokens
    row_counts: np.ndarray  # [2]: decode rows, prefill rows
    token_rows: np.ndarray  # [T], each token's row; -1 for padding tokens

    @staticmethod
    def packed_size(num_tokens: int, num_rows: int, table_width: int) -> int:
        """How many values ``to_device`` copies for a step of at most these sizes (what a
        graph runner's staging buffer must hold): the per-token arrays, the per-row ones,
        ``query_start_loc``'s extra entry and ``row_counts``, the block tables."""
        return 4 * num_tokens + 3 * num_rows + 1 + 2 + num_rows * table_width

    def to_device(self, device: torch.device, staging: Tensor | None = None) -> dict[str, Tensor]:
        """Every array in one host-to-device copy (into ``staging`` when given), as named flat
        int64 views of the copy."""
        arrays = {f.name: getattr(self, f.name).ravel() for f in fields(self)}
        packed = torch.from_numpy(np.concatenate(list(arrays.values())))
        if staging is None:
            copied = packed.to(device, non_blocking=True)
        else:
            copied = staging[: packed.numel()]
            copied.copy_(packed, non_blocking=True)
        views = torch.split(copied, [array.size for array in arrays.values()])
        return dict(zip(arrays, views, strict=True))


def host_batch(
    seqs: list[ScheduledSequence],
    block_size: int,
    num_rows: int | None = None,
    num_tokens: int | None = None,
) -> HostBatch:
    """Flatten scheduled sequences with numpy (no per-token Python work).

    ``num_rows`` and ``num_tokens`` pad to a CUDA graph's fixed shapes: padding rows hold
    no tokens (their attention programs exit at once) and padding tokens belong to no row,
    sit at position 0 and are written nowhere (slot -1). ``block_tables`` has the real rows
    only (a row without tokens never reads its table), as wide as the longest table: a
    graph's wider buffer takes them in its first columns, since no kernel reads past a
    row's last block, and packing the whole width cost a long context every step.
    """
    count = len(seqs)
    rows = num_rows or count
    query_lens = np.zeros(rows, dtype=np.int64)
    query_lens[:count] = [len(s.token_ids) for s in seqs]
    computed = np.zeros(rows, dtype=np.int64)
    computed[:count] = [s.num_computed for s in seqs]
    starts = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(query_lens, out=starts[1:])
    real = int(starts[-1])
    total = num_tokens or real
    width = max(1, max((len(s.block_table) for s in seqs), default=1))
    tables = np.zeros((count, width), dtype=np.int64)
    for row, s in enumerate(seqs):
        tables[row, : len(s.block_table)] = s.block_table
    owner = np.repeat(np.arange(count), query_lens[:count])
    positions = np.zeros(total, dtype=np.int64)
    positions[:real] = np.arange(real) - starts[owner] + computed[owner]
    slots = np.full(total, -1, dtype=np.int64)
    own = positions[:real]
    slots[:real] = tables[owner, own // block_size] * block_size + own % block_size
    input_ids = np.zeros(total, dtype=np.int64)
    input_ids[:real] = [t for s in seqs for t in s.token_ids]
    kinds = np.where(query_lens == 1, 0, np.where(query_lens > 1, 1, 2))
    token_rows = np.full(total, -1, dtype=np.int64)
    token_rows[:real] = owner
    return HostBatch(
        input_ids,
        positions,
        slots,
        tables,
        computed + query_lens,
        starts,
        np.argsort(kinds, kind="stable"),
        np.bincount(kinds, minlength=3)[:2],
        token_rows,
    )


def build_metadata(
    seqs: list[ScheduledSequence], block_size: int, device: torch.device, long_rows_from: int = 0
) -> tuple[Tensor, AttentionMetadata]:
    """Input ids ``[T]`` and metadata of a step, copied to ``device`` in one transfer.
    ``long_rows_from``: rows with this many new tokens or more take the fused attention path
    (``attention.long_prefill``; 0: none does)."""
    host = host_batch(seqs, block_size)
    dev = {name: view if name in _INT64 else view.int() for name, view in
           host.to_device(device).items()}  # fmt: skip
    meta = AttentionMetadata(
        positions=dev["positions"],
        slot_mapping=dev["slot_mapping"],
        block_tables=dev["block_tables"].view(len(seqs), -1),
        seq_lens=dev["seq_lens"],
        query_start_loc=dev["query_start_loc"],
        max_query_len=int(np.diff(host.query_start_loc).max(initial=0)),
        max_seq_len=int(host.seq_lens.max(initial=0)),
        row_order=dev["row_order"],
        row_counts=dev["row_counts"],
        token_rows=dev["token_rows"],
    )
    if long_rows_from > 0:
        from infer.attention.long_prefill import plan_long_prefill

        meta.long_prefill = plan_long_prefill(host, meta, block_size, long_rows_from)
    return dev["input_ids"], meta


# The arrays that stay int64 on the device (token ids and positions index embeddings and
# rotary tables, slots the cache); the kernels read the rest as int32.
_INT64 = frozenset({"input_ids", "positions", "slot_mapping"})
