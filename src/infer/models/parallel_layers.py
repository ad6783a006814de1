"""Linear and embedding layers whose weights are split over the tensor-parallel ranks.

Megatron's layout, one all-reduce per attention block and one per MLP block:

- ``ColumnParallelLinear`` splits output features (q/k/v heads, gate/up rows): each rank
  computes its heads or its slice of the intermediate activations, with no communication.
- ``RowParallelLinear`` splits input features (``o_proj``, ``down_proj``): each rank's
  product is a partial sum, all-reduced into the full output.
- ``VocabParallelEmbedding`` and ``ParallelLMHead`` split the vocabulary (padded to a
  multiple of the ranks): an embedding row lives on one rank (zeros elsewhere, one
  all-reduce), and the LM head's logits are gathered so every rank holds the full ``[B, V]``
  (only rank 0 samples from them).

Each layer loads a checkpoint tensor by taking its own rank's rows or columns of it; the
tensor may be a safetensors slice, so a rank reads only its part of the file. A linear layer
switched to FP8 (``use_fp8``) quantises its rows as they arrive, after slicing, or takes FP8
rows and their ``weight_scale`` as a checkpoint stores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from infer.distributed.group import ParallelGroup
from infer.models.fp8 import FP8, fp8_linear, quantize_rows

# A checkpoint tensor: a torch tensor or a lazy safetensors slice (``get_shape``, ``[...]``).
CheckpointTensor = Any


def checkpoint_shape(tensor: CheckpointTensor) -> tuple[int, ...]:
    if isinstance(tensor, Tensor):
        return tuple(tensor.shape)
    return tuple(tensor.get_shape())


def checked_part(
    tensor: CheckpointTensor,
    name: str,
    full: tuple[int, ...],
    index: slice | tuple[slice, ...] = slice(None),
) -> Tensor:
    """``tensor[index]`` (this rank's part) after checking the checkpoint's whole shape
    against ``full``, the model's unsplit shape."""
    shape = checkpoint_shape(tensor)
    if shape != full:
        raise ValueError(
            f"tensor {name}: checkpoint shape {shape} does not match the model's {full}"
        )
    part: Tensor = tensor[index]
    return part


def copy_checked(
    target: Tensor,
    tensor: CheckpointTensor,
    name: str,
    full: tuple[int, ...],
    index: slice | tuple[slice, ...] = slice(None),
) -> None:
    """Copy ``tensor[index]`` into ``target`` (see ``checked_part``)."""
    target.copy_(checked_part(tensor, name, full, index))


@dataclass(frozen=True)
class Split:
    """A checkpoint projection of ``size`` rows cut into ``parts`` equal pieces; rank ``r``
    of ``world`` holds piece ``r * parts // world``. ``parts == world`` splits it; fewer
    parts replicate each piece over ``world / parts`` ranks (KV heads fewer than ranks)."""

    size: int
    parts: int

    def rows(self, rank: int, world: int) -> slice:
        piece = self.size // self.parts
        start = (rank * self.parts // world) * piece
        return slice(start, start + piece)


class ShardedModule(nn.Module):
    """A module that knows its parameters' unsplit shapes and loads its rank's part."""

    group: ParallelGroup

    def full_shape(self, param: str) -> tuple[int, ...]:
        raise NotImplementedError

    def load(self, param: str, tensor: CheckpointTensor, name: str, shard: str | None) -> None:
        """Load ``param`` from the whole checkpoint tensor ``name`` (``shard``: which of a
        fused layer's projections it is; None for the fused whole)."""
        raise NotImplementedError


class ParallelLinear(nn.Linear, ShardedModule):
    """A linear layer of a tensor-parallel model, in the model's dtype or in FP8 with a
    float32 scale per output row (``weight_scale``, None until ``use_fp8``)."""

    weight_scale: Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("weight_scale", None)

    def use_fp8(self) -> None:
        """Hold the weight in FP8 from now on (on the weight's device, meta included); the
        loader fills it and its scales."""
        device = self.weight.device
        self.weight = nn.Parameter(
            torch.empty(self.weight.shape, dtype=FP8, device=device), requires_grad=False
        )
        self.weight_scale = torch.empty(self.out_features, dtype=torch.float32, device=device)

    def matmul(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """``x @ weight.T (+ bias)``."""
        if self.weight_scale is None:
            return F.linear(x, self.weight, bias)
        out = fp8_linear(x, self.weight, self.weight_scale)
        return out if bias is None else out + bias

    def store_rows(self, rows: slice, part: Tensor, name: str) -> None:
        """Write checkpoint rows into ``weight[rows]``: an FP8 layer quantises wider rows
        (their scales with them) and copies FP8 rows, whose scales come as ``weight_scale``."""
        if part.dtype == FP8 and self.weight_scale is None:
            raise ValueError(
                f"tensor {name}: FP8 weights, but the checkpoint's config.json declares no "
                "FP8 quantization_config"
            )
        if self.weight_scale is None or part.dtype == FP8:
            self.weight.data[rows].copy_(part)
            return
        q, scale = quantize_rows(part.to(self.weight.device))
        self.weight.data[rows].copy_(q)
        self.weight_scale[rows].copy_(scale)

    def store_scales(
        self, rows: slice, tensor: CheckpointTensor, name: str, size: int, index: slice
    ) -> None:
        """``weight_scale[rows]`` from a checkpoint's per-tensor scale (one value) or
        per-channel scales (``size`` of them, ``[size]`` or ``[size, 1]``) of which this
        rank takes ``index``."""
        if self.weight_scale is None:
            raise ValueError(f"tensor {name}: a weight scale for a layer that is not FP8")
        whole = torch.as_tensor(tensor[...]).float().flatten()
        if whole.numel() == 1:
            self.weight_scale[rows].fill_(whole.item())
        elif whole.numel() == size:
            self.weight_scale[rows].copy_(whole[index])
        else:
            raise ValueError(
                f"tensor {name}: {whole.numel()} scales, expected 1 (per tensor) or "
                f"{size} (per output channel)"
            )


class ColumnParallelLinear(ParallelLinear):
    """Several checkpoint projections stacked along the output (``qkv_proj``,
    ``gate_up_proj``), each split over the ranks by its ``Split``."""

    def __init__(
        self, in_features: int, shards: dict[str, Split], *, bias: bool, group: ParallelGroup
    ) -> None:
        rank, world = group.rank, group.world_size
        local = {name: split.rows(rank, world) for name, split in shards.items()}
        super().__init__(in_features, sum(s.stop - s.start for s in local.values()), bias)
        self.group = group
        self.shards = shards
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, rows in local.items():
            self.shard_offsets[name] = (start, rows.stop - rows.start)
            start += rows.stop - rows.start

    def forward(self, x: Tensor) -> Tensor:
        return self.matmul(x, self.bias)

    def full_shape(self, param: str) -> tuple[int, ...]:
        rows = sum(split.size for split in self.shards.values())
        return (rows, self.in_features) if param == "weight" else (rows,)

    def load(self, param: str, tensor: CheckpointTensor, name: str, shard: str | None) -> None:
        if shard is None:  # the fused whole (dummy weights): one projection after another
            start = 0
            for each, split in self.shards.items():
                self.load(param, tensor[start : start + split.size], name, each)
                start += split.size
            return
        split = self.shards[shard]
        offset, size = self.shard_offsets[shard]
        local = slice(offset, offset + size)
        rows = split.rows(self.group.rank, self.group.world_size)
        if param == "weight_scale":
            self.store_scales(local, tensor, name, split.size, rows)
            return
        if param == "weight":
            full = (split.size, self.in_features)
            self.store_rows(local, checked_part(tensor, name, full, rows), name)
            return
        assert self.bias is not None
        copy_checked(self.bias.data[local], tensor, name, (split.size,), rows)


class RowParallelLinear(ParallelLinear):
    """Input features split over the ranks; the partial products are all-reduced, then the
    bias (held whole by every rank) is added once."""

    def __init__(
        self, in_features: int, out_features: int, *, bias: bool, group: ParallelGroup
    ) -> None:
        super().__init__(in_features // group.world_size, out_features, bias)
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        out = self.group.all_reduce(self.matmul(x))
        return out if self.bias is None else out + self.bias

    def full_shape(self, param: str) -> tuple[int, ...]:
        if param == "weight":
            return (self.out_features, self.in_features * self.group.world_size)
        return (self.out_features,)

    def load(self, param: str, tensor: CheckpointTensor, name: str, shard: str | None) -> None:
        if param == "bias":
            assert self.bias is not None
            copy_checked(self.bias.data, tensor, name, self.full_shape(param))
            return
        every_row = slice(None)
        if param == "weight_scale":  # one per output row, which every rank holds whole
            self.store_scales(every_row, tensor, name, self.out_features, every_row)
            return
        start = self.group.rank * self.in_features
        columns = (every_row, slice(start, start + self.in_features))
        part = checked_part(tensor, name, self.full_shape(param), columns)
        self.store_rows(every_row, part, name)


class VocabShard(ShardedModule):
    """The vocabulary rows ``[start, start + valid)`` of this rank (``rows_per_rank`` with
    padding beyond the vocabulary's end)."""

    weight: nn.Parameter

    def __init__(self, vocab_size: int, hidden: int, group: ParallelGroup) -> None:
        super().__init__()
        self.group = group
        self.vocab_size = vocab_size
        self.rows_per_rank = -(-vocab_size // group.world_size)
        self.start = group.rank * self.rows_per_rank
        self.valid = max(0, min(self.rows_per_rank, vocab_size - self.start))
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden))

    def full_shape(self, param: str) -> tuple[int, ...]:
        return (self.vocab_size, self.weight.shape[1])

    def load(self, param: str, tensor: CheckpointTensor, name: str, shard: str | None) -> None:
        rows = slice(self.start, self.start + self.valid)
        self.weight.data[self.valid :].zero_()
        copy_checked(self.weight.data[: self.valid], tensor, name, self.full_shape(param), rows)


class VocabParallelEmbedding(VocabShard):
    def forward(self, input_ids: Tensor) -> Tensor:
        if self.group.world_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.valid)
        hidden = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(hidden.masked_fill(outside.unsqueeze(-1), 0.0))


class ParallelLMHead(VocabShard):
    def forward(self, hidden: Tensor) -> Tensor:
        """Logits ``[T, vocab]`` on every rank."""
        logits = self.group.all_gather_last(F.linear(hidden, self.weight))
        return logits if self.group.world_size == 1 else logits[:, : self.vocab_size]
