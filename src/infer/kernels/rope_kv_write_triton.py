"""Triton: a step's rotary embedding and K/V cache write in one launch (NeoX / Hugging Face
``rotate_half`` layout).

Each program takes one token: it rotates the token's query heads in place, and writes its key
heads, rotated, and its value heads to the token's slot in the paged cache (``slot = block *
block_size + offset``; ``-1`` writes nothing). Attention reads keys only from the cache, so
the rotated keys are not stored back. One launch a layer instead of two (rotate, then
write): inside a CUDA graph each launch costs a few microseconds, however little it does.

An FP8 (e4m3) cache stores ``k / k_scale`` and ``v / v_scale`` clamped to ±448, one scale per
tensor and layer (the torch reference's ``write_kv_torch``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.fp8 import FP8
from infer.kernels.pdl import pdl_launch, wait_for_previous_kernel


@triton.jit
def _narrow(x, scale, FP8: tl.constexpr, DTYPE: tl.constexpr):
    """``x`` as the cache stores it (``Dst``'s dtype follows): FP8 rounded to the
    activations' ``DTYPE`` first (as the torch reference rotates in it), divided by its scale
    (IEEE division) and clamped (e4m3 has no infinity); any other dtype as it is."""
    if FP8:  # one return: the compiler types every return, also past a constexpr branch
        x = tl.clamp(tl.math.div_rn(x.to(DTYPE).to(tl.float32), scale), -448.0, 448.0)
    return x


@triton.jit
def _rotate_heads(
    X, stride_xh, Dst, stride_dh, n_heads, cos, sin, scale,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, FP8: tl.constexpr,
):  # fmt: skip
    """Rotates the heads at ``X`` into ``Dst``: ``(x1, x2) → (x1 cos - x2 sin, x2 cos + x1
    sin)``, narrowed by ``scale`` when ``FP8``."""
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads < n_heads)[:, None] & (cols < HALF)[None, :]
    src = X + heads[:, None] * stride_xh + cols[None, :]
    dst = Dst + heads[:, None] * stride_dh + cols[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    out1 = _narrow(x1 * cos - x2 * sin, scale, FP8, X.dtype.element_ty)
    out2 = _narrow(x2 * cos + x1 * sin, scale, FP8, X.dtype.element_ty)
    tl.store(dst, out1.to(Dst.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, out2.to(Dst.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kv_write_kernel(
    Q, K, V, KCache, VCache, Positions, SlotMapping, CosSin, n_q_heads, n_kv_heads,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kch, stride_kco, stride_vcb, stride_vch, stride_vco, stride_cs,
    k_scale, v_scale,
    HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, FP8_CACHE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(Positions + token)
    slot = tl.load(SlotMapping + token).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < HALF
    cos = tl.load(CosSin + pos * stride_cs + cols, mask=col_ok, other=0.0).to(tl.float32)
    sin = tl.load(CosSin + pos * stride_cs + HALF + cols, mask=col_ok, other=0.0).to(tl.float32)
    cos, sin = cos[None, :], sin[None, :]
    q = Q + token * stride_qt
    _rotate_heads(q, stride_qh, q, stride_qh, n_q_heads, cos, sin, 1.0,
                  HALF, BLOCK_HQ, BLOCK_HALF, False)  # fmt: skip
    if slot < 0:
        return  # a padding token: written nowhere
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    k_dst = KCache + block * stride_kcb + offset * stride_kco
    _rotate_heads(K + token * stride_kt, stride_kh, k_dst, stride_kch, n_kv_heads, cos, sin,
                  k_scale, HALF, BLOCK_HK, BLOCK_HALF, FP8_CACHE)  # fmt: skip
    heads = tl.arange(0, BLOCK_HK)[:, None]
    mask = (heads < n_kv_heads) & col_ok[None, :]
    v = V + token * stride_vt + heads * stride_vh + cols[None, :]
    v_dst = VCache + block * stride_vcb + offset * stride_vco + heads * stride_vch + cols[None, :]
    for half in tl.static_range(2):
        values = _narrow(tl.load(v + half * HALF, mask=mask), v_scale, FP8_CACHE,
                         V.dtype.element_ty)  # fmt: skip
        tl.store(v_dst + half * HALF, values.to(VCache.dtype.element_ty), mask=mask)


def rope_and_write_kv_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    cos_sin_cache: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> Tensor:
    """Rotates ``q [T, H, D]`` in place and writes ``k`` (rotated) and ``v [T, Hkv, D]`` into
    the caches ``[N, Hkv, BS, D]`` by slot; returns ``q``. Strided views (a fused qkv) are
    fine; ``cos_sin_cache [P, D]`` holds cos in its first ``D/2`` columns and sin in the rest.
    An FP8 cache gets ``k / kv_scales[0]`` and ``v / kv_scales[1]``.
    """
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("rope_and_write_kv_triton needs a contiguous last (head_dim) dimension")
    num_tokens, n_q_heads, head_dim = q.shape
    if num_tokens:
        half, n_kv_heads = head_dim // 2, k.shape[1]
        _rope_kv_write_kernel[(num_tokens,)](
            q, k, v, k_cache, v_cache, positions, slot_mapping, cos_sin_cache,
            n_q_heads, n_kv_heads, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), cos_sin_cache.stride(0),
            float(kv_scales[0]), float(kv_scales[1]),
            HALF=half, BLOCK_SIZE=k_cache.shape[2], BLOCK_HQ=triton.next_power_of_2(n_q_heads),
            BLOCK_HK=triton.next_power_of_2(n_kv_heads), BLOCK_HALF=triton.next_power_of_2(half),
            FP8_CACHE=k_cache.dtype == FP8, **pdl_launch(q),
        )  # fmt: skip
    return q
