"""Triton rotary embedding, in place on q and k (NeoX / Hugging Face ``rotate_half`` layout)."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _rotate_heads(
    X,
    stride_h,
    n_heads,
    cos,
    sin,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Rotates all heads of one token: ``(x1, x2) → (x1 cos - x2 sin, x2 cos + x1 sin)``."""
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads < n_heads)[:, None] & (cols < HALF)[None, :]
    ptrs = X + heads[:, None] * stride_h + cols[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (x1 * cos - x2 * sin).to(X.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, (x2 * cos + x1 * sin).to(X.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q,
    K,
    Positions,
    CosSin,
    n_q_heads,
    n_k_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cs,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(Positions + token)
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < HALF
    cos = tl.load(CosSin + pos * stride_cs + cols, mask=col_ok, other=0.0).to(tl.float32)
    sin = tl.load(CosSin + pos * stride_cs + HALF + cols, mask=col_ok, other=0.0).to(tl.float32)
    cos, sin = cos[None, :], sin[None, :]
    _rotate_heads(Q + token * stride_qt, stride_qh, n_q_heads, cos, sin, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(K + token * stride_kt, stride_kh, n_k_heads, cos, sin, HALF, BLOCK_HK, BLOCK_HALF)


def apply_rope_triton(
    q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor
) -> tuple[Tensor, Tensor]:
    """Rotates ``q [T, H, D]`` and ``k [T, Hkv, D]`` in place (strided views allowed).

    ``cos_sin_cache [P, D]`` holds cos in its first ``D/2`` columns and sin in the rest.
    """
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("apply_rope_triton needs a contiguous last (head_dim) dimension")
    num_tokens, n_q_heads, head_dim = q.shape
    if num_tokens:
        half = head_dim // 2
        _rope_kernel[(num_tokens,)](
            q, k, positions, cos_sin_cache, n_q_heads, k.shape[1],
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
            HALF=half, BLOCK_HQ=triton.next_power_of_2(n_q_heads),
            BLOCK_HK=triton.next_power_of_2(k.shape[1]), BLOCK_HALF=triton.next_power_of_2(half),
        )  # fmt: skip
    return q, k
