"""The flat ragged batch as the attention kernels read it (no triton import: the metadata
that extends it is built on machines without triton too)."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])
