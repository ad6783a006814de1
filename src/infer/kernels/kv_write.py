"""Writes a step's new K/V into the paged pool by slot (``slot = block * block_size + offset``)."""

from __future__ import annotations

from torch import Tensor

from infer.kernels.dispatch import use_triton


def write_kv_torch(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Reference. ``k, v [T, Hkv, D]``; caches ``[N, Hkv, BS, D]``; slot ``-1`` = skip."""
    block_size = k_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, :, offsets, :] = k[keep].to(k_cache.dtype)
    v_cache[blocks, :, offsets, :] = v[keep].to(v_cache.dtype)


def write_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    if use_triton(k):
        from infer.kernels.kv_write_triton import write_kv_triton

        write_kv_triton(k, v, k_cache, v_cache, slot_mapping)
        return
    write_kv_torch(k, v, k_cache, v_cache, slot_mapping)
