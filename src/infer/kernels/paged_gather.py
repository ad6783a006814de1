"""A sequence's K and V from the paged cache, laid end to end (``[Hkv, L, D]`` views of
token-major ``[L, Hkv, D]`` storage)."""

from __future__ import annotations

import torch
from torch import Tensor

from infer.kernels.dispatch import use_triton
from infer.kernels.fp8 import indexable


def gather_kv(
    k_cache: Tensor,
    v_cache: Tensor,
    blocks: Tensor,
    length: int,
    dtype: torch.dtype,
    scales: tuple[float, float] = (1.0, 1.0),
) -> tuple[Tensor, Tensor]:
    """The first ``length`` tokens of the blocks ``blocks`` (int64, in sequence order) of
    ``k_cache, v_cache [N, Hkv, BS, D]``, as ``[Hkv, length, D]`` tensors in ``dtype``: an
    FP8 cache's values times ``scales`` (K's, V's).

    Their storage is token-major, so the strides of any slice of tokens do not depend on
    ``length``: cuDNN caches its attention plans by shape and strides, and a chunk's keys
    then meet the same plan at every step of a long prompt."""
    _, _, block_size, dim = k_cache.shape
    if use_triton(k_cache) and _power_of_two(block_size) and _power_of_two(dim):
        from infer.kernels.paged_gather_triton import gather_kv_triton

        return gather_kv_triton(k_cache, v_cache, blocks, length, dtype, scales)
    return (
        gather_torch(k_cache, blocks, length, dtype, scales[0]),
        gather_torch(v_cache, blocks, length, dtype, scales[1]),
    )


def gather_torch(
    cache: Tensor, blocks: Tensor, length: int, dtype: torch.dtype, scale: float
) -> Tensor:
    """One cache's ``gather_kv``: the reference."""
    heads, dim = cache.shape[1], cache.shape[3]
    picked = indexable(cache).transpose(0, 1).index_select(1, blocks).view(cache.dtype)
    flat = picked.reshape(heads, -1, dim)[:, :length]
    if flat.dtype != dtype:
        flat = flat.to(dtype) * scale if scale != 1.0 else flat.to(dtype)
    return token_major(heads, length, dim, dtype, cache.device).copy_(flat)


def token_major(
    heads: int, length: int, dim: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """An empty ``[heads, length, dim]`` tensor whose storage is ``[length, heads, dim]``."""
    return torch.empty(length, heads, dim, dtype=dtype, device=device).transpose(0, 1)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
