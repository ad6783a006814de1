"""The flat ragged batch as the attention kernels read it (no triton import: the metadata
that extends it is built on machines without triton too)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class RaggedBatch:
    """The flat ragged batch as the kernels read it (see ``attention.metadata``)."""

    block_tables: Tensor  # [B, W] int32
    seq_lens: Tensor  # [B] int32, context length after this step
    query_start_loc: Tensor  # [B + 1] int32
    max_query_len: int
    max_seq_len: int
    # The decode rows the keys' splits are sized for (flash-decoding), when fewer than the
    # rows: a mixed step's graph holds mostly prompt and padding rows (``cuda_graphs``).
    split_rows: int | None = None
    # Rows with up to this many new tokens are decode rows, their queries causal among
    # themselves (a step verifying speculative proposals sets it; no row may have more).
    decode_queries: int = 1
    # Where the kernels' programs find their work without searching the batch (the host
    # knows it): rows with one new token (decode) first, then rows with more (prefill), then
    # rows with none (a graph bucket's padding), so a grid sized for the bucket starts the
    # real work first and its spare programs exit after one read.
    row_order: Tensor = field(kw_only=True)  # [B] int32
    row_counts: Tensor = field(kw_only=True)  # [2] int32: decode rows, prefill rows
    token_rows: Tensor = field(kw_only=True)  # [T] int32, each token's row; -1 = padding

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])
