"""The Triton paged-attention kernels over a step's ``AttentionMetadata``.

The kernels are leaves (tensors and plain values in); what belongs to a step lives here: the
split-KV scratch buffers are allocated once per step and shared by all its layers (inside a
CUDA graph capture, once per captured step).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from infer.attention.metadata import AttentionMetadata
from infer.kernels.paged_attention import new_split_scratch, paged_attention


def paged_attention_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int = 0,
    *,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    **overrides: Any,
) -> Tensor:
    """``paged_attention`` for one layer of a step (an FP8 cache's values times
    ``kv_scales``); ``overrides`` are its tile and split keywords (tests and kernel
    benchmarks)."""

    def scratch(shape: tuple[int, ...], counters: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
        return _step_scratch(meta, shape, counters, q.device)

    return paged_attention(
        q, k_cache, v_cache, meta, scale, sliding_window, scratch=scratch, kv_scales=kv_scales,
        **overrides,
    )  # fmt: skip


def _step_scratch(
    meta: AttentionMetadata,
    shape: tuple[int, ...],
    counters: tuple[int, int],
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor]:
    key = f"paged_attention_splits_{shape}_{counters}"
    if key not in meta.derived:
        meta.derived[key] = new_split_scratch(shape, counters, device)
    return meta.derived[key]
