"""The token id each KV cache slot holds, kept on the device beside the K/V.

Every step writes its input tokens' ids where it writes their K/V (``slot_mapping``), so a
sequence's tokens can be read on the device through its block table: the n-gram lookup of a
verify step finds its proposals there without the host knowing the sequence's latest tokens
(``kernels.verify_inputs``). Blocks copied on write copy their ids too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from infer.kernels.verify_inputs import write_history


class TokenHistory:
    def __init__(self, num_blocks: int, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        # One id per slot and a sink that the tokens written nowhere (slot -1) land in.
        self.ids = torch.full((num_blocks * block_size + 1,), -1, dtype=torch.int32, device=device)

    def write(self, input_ids: Tensor, slot_mapping: Tensor) -> None:
        """Record a step's input tokens in their slots (queued on the device)."""
        write_history(self.ids, input_ids, slot_mapping)

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy each (source, destination) block's ids, as ``KVTensors.copy_blocks`` does."""
        if not copies:
            return
        size = self.block_size
        index = torch.tensor(copies, dtype=torch.int64).to(self.ids.device, non_blocking=True)
        offsets = torch.arange(size, device=self.ids.device)
        source = (index[:, :1] * size + offsets).flatten()
        destination = (index[:, 1:] * size + offsets).flatten()
        self.ids[destination] = self.ids[source]
