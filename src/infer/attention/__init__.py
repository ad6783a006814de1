"""Paged attention over the flat ragged batch: one entry point, two implementations."""

from __future__ import annotations

from torch import Tensor

from infer.attention.metadata import AttentionMetadata, ScheduledSequence, build_metadata
from infer.attention.torch_backend import paged_attention_torch, write_kv_planned
from infer.kernels.dispatch import use_triton
from infer.kernels.kv_write import write_kv

__all__ = ["AttentionMetadata", "ScheduledSequence", "attend", "build_metadata"]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    *,
    scale: float,
    sliding_window: int = 0,
) -> Tensor:
    """Write this step's K/V into the cache, then attend: ``q [T, H, D]`` → ``[T, H, D]``."""
    if use_triton(q):
        from infer.attention.triton_backend import paged_attention_triton

        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return paged_attention_triton(q, k_cache, v_cache, meta, scale, sliding_window)
    write_kv_planned(k, v, k_cache, v_cache, meta)
    return paged_attention_torch(q, k_cache, v_cache, meta, scale, sliding_window)
