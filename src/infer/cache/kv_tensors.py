"""The paged cache's K/V storage, which the runner owns: one tensor each for keys and
values, ``[layers, num_blocks, kv_heads, block_size, head_dim]``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from infer.config import ModelConfig
from infer.kernels.fp8 import indexable


@dataclass
class KVTensors:
    k: Tensor
    v: Tensor

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVTensors:
        shape = (config.num_layers, num_blocks, config.num_kv_heads, block_size, config.head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy each (source, destination) block, every layer (queued on the device)."""
        if not copies:
            return
        index = torch.tensor(copies, dtype=torch.int64).to(self.k.device, non_blocking=True)
        source, destination = index[:, 0], index[:, 1]
        for pool in (indexable(self.k), indexable(self.v)):
            pool[:, destination] = pool[:, source]
