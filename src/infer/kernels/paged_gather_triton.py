"""Triton: ``paged_gather.gather_kv`` in one launch, a program per (block, KV head), K and V
together: each copies two ``[BS, D]`` tiles to their places in the contiguous outputs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.paged_gather import token_major


# fmt: off
@triton.jit
def _gather_kernel(
    KOut, VOut, K, V, Blocks, length, k_scale, v_scale,
    stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    stride_oh, stride_ot,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, SCALED: tl.constexpr,
):
    index = tl.program_id(0)
    head = tl.program_id(1)
    block = tl.load(Blocks + index).to(tl.int64)
    slots = tl.arange(0, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_DIM)
    tok = index * BLOCK_SIZE + slots
    ok = (tok < length)[:, None]
    src = slots[:, None] * stride_kt + dims[None, :]
    dst = head * stride_oh + tok[:, None].to(tl.int64) * stride_ot + dims[None, :]
    k = tl.load(K + block * stride_kb + head * stride_kh + src, mask=ok)
    v = tl.load(V + block * stride_vb + head * stride_vh + slots[:, None] * stride_vt
                + dims[None, :], mask=ok)
    if SCALED:
        k = k.to(tl.float32) * k_scale
        v = v.to(tl.float32) * v_scale
    tl.store(KOut + dst, k.to(KOut.dtype.element_ty), mask=ok)
    tl.store(VOut + dst, v.to(VOut.dtype.element_ty), mask=ok)
# fmt: on


def gather_kv_triton(
    k_cache: Tensor, v_cache: Tensor, blocks: Tensor, length: int, dtype: torch.dtype,
    scales: tuple[float, float],
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``paged_gather.gather_kv`` on the GPU (a power-of-two block size and head_dim)."""
    _, heads, block_size, dim = k_cache.shape
    k_out = token_major(heads, length, dim, dtype, k_cache.device)
    v_out = token_major(heads, length, dim, dtype, k_cache.device)
    count = triton.cdiv(length, block_size)
    _gather_kernel[(count, heads)](
        k_out, v_out, k_cache, v_cache, blocks, length, scales[0], scales[1],
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k_out.stride(0), k_out.stride(1),
        BLOCK_SIZE=block_size, HEAD_DIM=dim, SCALED=scales != (1.0, 1.0), num_warps=4,
    )  # fmt: skip
    return k_out, v_out
