"""Triton: ``merge_attention`` in one launch, a program per (token block, head)."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


# fmt: off
@triton.jit
def _merge_kernel(
    Out, A, LseA, B, LseB, num_tokens,
    stride_ot, stride_oh, stride_at, stride_ah, stride_bt, stride_bh,
    stride_lat, stride_lah, stride_lbt, stride_lbh,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
):
    head = tl.program_id(1)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = tok < num_tokens
    dims = tl.arange(0, HEAD_DIM)
    lse_a = tl.load(LseA + tok * stride_lat + head * stride_lah, mask=ok, other=float("-inf"))
    lse_b = tl.load(LseB + tok * stride_lbt + head * stride_lbh, mask=ok, other=float("-inf"))
    top = tl.maximum(lse_a, lse_b)
    top = tl.where(top == float("-inf"), 0.0, top)
    weight_a = tl.exp(lse_a - top)
    weight_b = tl.exp(lse_b - top)
    total = weight_a + weight_b
    total = tl.where(total > 0, total, 1.0)
    a = tl.load(A + tok[:, None] * stride_at + head * stride_ah + dims[None, :],
                mask=ok[:, None], other=0.0).to(tl.float32)
    b = tl.load(B + tok[:, None] * stride_bt + head * stride_bh + dims[None, :],
                mask=ok[:, None], other=0.0).to(tl.float32)
    merged = (a * (weight_a / total)[:, None] + b * (weight_b / total)[:, None])
    tl.store(Out + tok[:, None] * stride_ot + head * stride_oh + dims[None, :],
             merged.to(Out.dtype.element_ty), mask=ok[:, None])
# fmt: on


def merge_attention_triton(
    out: Tensor, out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor
) -> None:
    """``merge_attention.merge_attention`` on the GPU (a power-of-two head_dim)."""
    num_tokens, num_heads, head_dim = out.shape
    block_t = max(1, min(64, 8192 // head_dim))
    grid = (triton.cdiv(num_tokens, block_t), num_heads)
    _merge_kernel[grid](
        out, out_a, lse_a, out_b, lse_b, num_tokens,
        out.stride(0), out.stride(1), out_a.stride(0), out_a.stride(1),
        out_b.stride(0), out_b.stride(1), lse_a.stride(0), lse_a.stride(1),
        lse_b.stride(0), lse_b.stride(1),
        HEAD_DIM=head_dim, BLOCK_T=block_t, num_warps=4,
    )  # fmt: skip
