"""Rotary position embedding (NeoX / Hugging Face ``rotate_half`` layout)."""

from __future__ import annotations

import torch
from torch import Tensor

from infer.kernels.dispatch import use_triton


def apply_rope_torch(
    q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor
) -> tuple[Tensor, Tensor]:
    """Reference. ``q [T, H, D]``, ``k [T, Hkv, D]``, ``cos_sin_cache [P, D]`` = cos | sin."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: Tensor) -> Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def apply_rope(
    q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor
) -> tuple[Tensor, Tensor]:
    if use_triton(q):
        from infer.kernels.rope_triton import apply_rope_triton

        return apply_rope_triton(q, k, positions, cos_sin_cache)
    return apply_rope_torch(q, k, positions, cos_sin_cache)
