"""Rotary position embedding (NeoX / Hugging Face ``rotate_half`` layout): the torch reference
(the Triton kernel rotates and writes the cache in one launch: ``rope_kv_write_triton``)."""

from __future__ import annotations

import torch
from torch import Tensor


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
