"""Random weights at a model's exact shapes, for benchmarks without a checkpoint."""

from __future__ import annotations

import torch

from infer.models.common import DecoderModel, RMSNorm


@torch.no_grad()
def fill_dummy_weights(model: DecoderModel, seed: int = 0, std: float = 0.02) -> None:
    """Normal(0, std) for matrices, identity scale for norms; deterministic for a seed."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    norms = {id(m.weight) for m in model.modules() if isinstance(m, RMSNorm)}
    offsets = {id(m.weight): m.offset for m in model.modules() if isinstance(m, RMSNorm)}
    for param in model.parameters():
        if id(param) in norms:
            param.fill_(1.0 - offsets[id(param)])
        else:
            param.normal_(0.0, std, generator=generator)
