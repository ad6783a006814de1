"""Random weights at a model's exact shapes, for benchmarks without a checkpoint."""

from __future__ import annotations

import torch

from infer.models.common import DecoderModel, RMSNorm
from infer.models.parallel_layers import ShardedModule


@torch.no_grad()
def fill_dummy_weights(model: DecoderModel, seed: int = 0, std: float = 0.02) -> None:
    """Normal(0, std) for matrices, identity scale for norms; deterministic for a seed.

    Each parameter is drawn at its whole (unsplit) shape and the rank keeps its part, so the
    weights are the same for every ``tensor_parallel_size``.
    """
    device = next(model.parameters()).device
    dtype = model.model.embed_tokens.weight.dtype  # FP8 layers quantise what they are given
    generator = torch.Generator(device=device).manual_seed(seed)
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:  # a tied LM head
                continue
            seen.add(id(param))
            if isinstance(module, RMSNorm):
                param.fill_(1.0 - module.offset)
            elif isinstance(module, ShardedModule):
                full = torch.empty(module.full_shape(name), dtype=dtype, device=device)
                module.load(name, full.normal_(0.0, std, generator=generator), name, None)
            else:
                param.normal_(0.0, std, generator=generator)
