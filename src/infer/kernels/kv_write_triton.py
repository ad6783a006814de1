"""Triton K/V cache write: every new token's K and V go to their slot in one launch."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _write_kv_kernel(
    K,
    V,
    KCache,
    VCache,
    SlotMapping,
    n_heads,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kch,
    stride_kco,
    stride_vcb,
    stride_vch,
    stride_vco,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(SlotMapping + token).to(tl.int64)
    if slot < 0:
        return  # padding row: written nowhere
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < n_heads) & (dims < HEAD_DIM)
    k = tl.load(K + token * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(V + token * stride_vt + heads * stride_vh + dims, mask=mask)
    k_dst = KCache + block * stride_kcb + offset * stride_kco + heads * stride_kch + dims
    v_dst = VCache + block * stride_vcb + offset * stride_vco + heads * stride_vch + dims
    tl.store(k_dst, k.to(KCache.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(VCache.dtype.element_ty), mask=mask)


def write_kv_triton(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Writes ``k, v [T, Hkv, D]`` into caches ``[N, Hkv, BS, D]`` by slot (``-1`` skips)."""
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("write_kv_triton needs a contiguous last (head_dim) dimension")
    num_tokens, n_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, n_heads,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[2],
        BLOCK_H=triton.next_power_of_2(n_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip
