"""The flat ragged batch every attention layer of one step reads.

All sequences' new tokens are concatenated (``T`` tokens); sequence ``b`` owns query rows
``query_start_loc[b]:query_start_loc[b+1]`` and, after this step, ``seq_lens[b]`` tokens of
context in the blocks listed by ``block_tables[b]``. Its queries sit at the last positions of
that context, so prefill, a prefill chunk, a prefix-cached prefill and a decode token are the
same case with different lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor


@dataclass
class AttentionMetadata:
    positions: Tensor  # [T] int64, absolute position of each new token
    slot_mapping: Tensor  # [T] int64, where each new token's K/V is written; -1 = nowhere
    block_tables: Tensor  # [B, W] int32, physical blocks of each sequence
    seq_lens: Tensor  # [B] int32, context length of each sequence after this step
    query_start_loc: Tensor  # [B + 1] int32, prefix sum of the query lengths
    max_query_len: int
    max_seq_len: int
    # Per-step values derived once and shared by all layers (e.g. the torch backend's plan).
    derived: dict[str, Any] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


@dataclass
class ScheduledSequence:
    """One sequence's part of a step: which blocks it owns and which tokens run now."""

    block_table: list[int]
    num_computed: int  # tokens whose K/V is already in the cache
    token_ids: list[int]  # the tokens computed in this step


def build_metadata(
    seqs: list[ScheduledSequence], block_size: int, device: torch.device
) -> tuple[Tensor, AttentionMetadata]:
    """Flatten scheduled sequences into input ids and metadata (numpy on the host, one copy).

    Returns ``(input_ids [T], metadata)``.
    """
    query_lens = np.fromiter((len(s.token_ids) for s in seqs), dtype=np.int64, count=len(seqs))
    computed = np.fromiter((s.num_computed for s in seqs), dtype=np.int64, count=len(seqs))
    seq_lens = computed + query_lens
    starts = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(query_lens, out=starts[1:])
    total = int(starts[-1])
    width = max(1, max((len(s.block_table) for s in seqs), default=1))
    tables = np.zeros((len(seqs), width), dtype=np.int64)
    for row, s in enumerate(seqs):
        tables[row, : len(s.block_table)] = s.block_table
    owner = np.repeat(np.arange(len(seqs)), query_lens)
    positions = np.arange(total, dtype=np.int64) - np.repeat(starts[:-1], query_lens)
    positions += np.repeat(computed, query_lens)
    slots = tables[owner, positions // block_size] * block_size + positions % block_size
    input_ids = np.fromiter(
        (t for s in seqs for t in s.token_ids), dtype=np.int64, count=total
    )
    host = np.concatenate([input_ids, positions, slots])
    packed = torch.from_numpy(host).to(device, non_blocking=True)
    meta = AttentionMetadata(
        positions=packed[total : 2 * total],
        slot_mapping=packed[2 * total :],
        block_tables=torch.from_numpy(tables.astype(np.int32)).to(device, non_blocking=True),
        seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(device, non_blocking=True),
        query_start_loc=torch.from_numpy(starts.astype(np.int32)).to(device, non_blocking=True),
        max_query_len=int(query_lens.max(initial=0)),
        max_seq_len=int(seq_lens.max(initial=0)),
    )
    return packed[:total], meta
