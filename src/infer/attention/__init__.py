"""Paged attention over the flat ragged batch: one entry point, two implementations."""

from __future__ import annotations

import torch
from torch import Tensor

from infer.attention.long_prefill import long_prefill_attention, takes_long_path
from infer.attention.metadata import AttentionMetadata, ScheduledSequence, build_metadata
from infer.attention.torch_backend import paged_attention_torch, write_kv_planned
from infer.kernels.dispatch import use_triton
from infer.kernels.rope import apply_rope_torch

__all__ = ["AttentionMetadata", "ScheduledSequence", "attend", "build_metadata"]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    *,
    cos_sin: Tensor,
    scale: float,
    sliding_window: int = 0,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> Tensor:
    """Rotate ``q`` and ``k`` (RoPE at ``meta.positions``, table ``cos_sin``), write this
    step's K/V into the cache, then attend: ``q [T, H, D]`` → ``[T, H, D]``. On the GPU the
    rotation and the write are one kernel, and ``q`` is rotated in place. An FP8 cache
    holds K and V divided by ``kv_scales`` (one per tensor, this layer's), which every
    reader multiplies back."""
    if use_triton(q):
        from infer.attention.triton_backend import paged_attention_triton
        from infer.kernels.rope_kv_write_triton import rope_and_write_kv_triton

        rope_and_write_kv_triton(
            q, k, v, meta.positions, cos_sin, k_cache, v_cache, meta.slot_mapping, kv_scales
        )
        long = meta.long_prefill
        if long is not None and takes_long_path(q, sliding_window):
            rest = long.rest
            if rest is None:
                out = torch.empty_like(q)
            else:
                out = paged_attention_triton(
                    q, k_cache, v_cache, rest, scale, sliding_window, kv_scales=kv_scales
                )
            long_prefill_attention(
                out, q, k_cache, v_cache, long.rows, scale, kv_scales, sliding_window
            )
            return out
        return paged_attention_triton(
            q, k_cache, v_cache, meta, scale, sliding_window, kv_scales=kv_scales
        )
    q, k = apply_rope_torch(q, k, meta.positions, cos_sin)
    write_kv_planned(k, v, k_cache, v_cache, meta, kv_scales)
    return paged_attention_torch(q, k_cache, v_cache, meta, scale, sliding_window, kv_scales)
