"""Triton: the two halves of an FP8 linear layer that torch has no single op for.

* ``w8a16_linear_triton``: ``x @ (q_w * s_w).T`` for a few rows. The FP8 weight ``[N, K]`` is
  read once and widened in registers; the activations stay in their dtype (no activation
  quantisation) and the per-output-channel scales are applied once, after the sum. A step of
  few rows is bound by reading the weights, and FP8 halves those bytes.
* ``quantize_rows_triton``: each row's amax, scale and e4m3 cast in one pass over it, for the
  many-row path (``torch._scaled_mm`` row-wise), which wants FP8 activations.

Both launch on shapes only (no host reads), so a CUDA graph captures them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.fp8 import FP8, FP8_MAX, INVERSE_FP8_MAX, MIN_SCALE
from infer.kernels.pdl import pdl_launch, wait_for_previous_kernel


@dataclass(frozen=True)
class W8A16Tile:
    """Launch shape of ``w8a16_linear_triton``.

    ``block_m`` rows of ``x`` per program: below 16 they are summed on the CUDA cores (a
    ``[block_m, block_n, block_k]`` product), 16 or more go through ``tl.dot`` (tensor
    cores). ``block_n`` output features and ``block_k`` input features per step;
    ``split_k`` programs share one output tile's K (their sums meet by atomic adds into a
    float32 buffer, so a split launch also zeroes and casts it).
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1


# Output features from which one or two rows read the weight through narrow dots rather
# than the CUDA-core sum (benchmarks/results-by-topic/11-fp8.md, 11.2).
_WIDE_OUTPUT = 8192


def w8a16_tile(m: int, n: int, k: int) -> W8A16Tile:
    """The tile for ``m`` rows of a ``[n, k]`` weight, from ``benchmarks/fp8_probe.py`` on an
    H100 at llama-3.2-3b's shapes (``benchmarks/results-by-topic/11-fp8.md``, 11.2, 11.6): one
    or two rows of a narrow weight on the CUDA cores (many small programs), anything else up
    to 16 rows through 16-row dots; more rows (weights ``_scaled_mm`` cannot take) through
    wider dots."""
    if m == 1 and n < _WIDE_OUTPUT:
        return W8A16Tile(1, 4, 512, 2) if n > 4096 else W8A16Tile(1, 8, 1024, 4)
    if m <= 2 and n < _WIDE_OUTPUT:
        return W8A16Tile(m, 4, 512, 4) if n <= 4096 else W8A16Tile(m, 8, 256, 4)
    if m <= 16:
        return W8A16Tile(16, 32, 256, 4, 4)
    if m <= 32:
        return W8A16Tile(16, 64, 128, 4, 4)
    if m <= 64:
        return W8A16Tile(32, 64, 128, 4, 4)
    if m <= 128:
        return W8A16Tile(64, 64, 128, 4, 3)
    return W8A16Tile(128, 128, 128, 8, 3)


# fmt: off
@triton.jit(do_not_specialize=["M"])  # one variant for every row count of a tile
def _w8a16_kernel(
    X, W, Scale, Out, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, USE_DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    # The row tile varies fastest, so the programs that share a weight tile run together
    # and all but the first find it in L2.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_len = K // SPLIT_K  # the launcher checks that SPLIT_K * BLOCK_K divides K when split
    k_lo = pid_k * k_len
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + (k_lo + offs_k)[None, :]
    wait_for_previous_kernel(PDL)
    x_ptrs = X + offs_m[:, None].to(tl.int64) * stride_xm + (k_lo + offs_k)[None, :]
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc3 = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        if EVEN_K:  # no mask along K: full-width loads
            x = tl.load(x_ptrs + k0, mask=m_ok[:, None], other=0.0)
            if EVEN_N:
                w = tl.load(w_ptrs + k0)
            else:
                w = tl.load(w_ptrs + k0, mask=n_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < k_len
            x = tl.load(x_ptrs + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if USE_DOT:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        else:
            acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    if not USE_DOT:
        acc = tl.sum(acc3, 2)
    scale = tl.load(Scale + offs_n, mask=n_ok, other=0.0)
    acc = acc * scale[None, :]
    o_ptrs = Out + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(o_ptrs, acc, mask=mask, sem="relaxed")


@triton.jit
def _quantize_rows_kernel(
    X, Q, S, K, stride_xm, stride_qm, min_scale,
    BLOCK_K: tl.constexpr, FP8_LIMIT: tl.constexpr, INVERSE_LIMIT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    ok = offs < K
    x = tl.load(X + row * stride_xm + offs, mask=ok, other=0.0).to(tl.float32)
    # The scale as torch computes it (``INVERSE_FP8_MAX``); the values by IEEE division
    # (``/`` is approximate on a GPU), as torch divides by a tensor.
    scale = tl.maximum(tl.max(tl.abs(x), 0), min_scale) * INVERSE_LIMIT
    q = tl.clamp(tl.math.div_rn(x, scale), -FP8_LIMIT, FP8_LIMIT)
    tl.store(Q + row * stride_qm + offs, q.to(Q.dtype.element_ty), mask=ok)
    tl.store(S + row, scale)
# fmt: on


def w8a16_linear_triton(x: Tensor, weight: Tensor, weight_scale: Tensor, tile: W8A16Tile) -> Tensor:
    """``x [M, K] @ (weight [N, K] * weight_scale [N, None]).T`` in ``x``'s dtype, with the
    FP8 weight widened in registers; ``x`` is a bfloat16/float16/float32 matrix whose last
    dimension is contiguous. Launched with programmatic dependent launch where the GPU has
    it (``infer.kernels.pdl``)."""
    m, k = x.shape
    n = weight.shape[0]
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("w8a16_linear_triton needs contiguous rows (last dimension)")
    if tile.split_k > 1 and k % (tile.split_k * tile.block_k):
        raise ValueError(f"split_k {tile.split_k} x block_k {tile.block_k} must divide K={k}")
    use_dot = tile.block_m >= 16
    if tile.split_k > 1:
        out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out.to(x.dtype)
    grid = (triton.cdiv(m, tile.block_m), triton.cdiv(n, tile.block_n), tile.split_k)
    _w8a16_kernel[grid](
        x, weight, weight_scale, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLIT_K=tile.split_k,
        EVEN_K=k % (tile.split_k * tile.block_k) == 0, EVEN_N=n % tile.block_n == 0,
        USE_DOT=use_dot, num_warps=tile.num_warps, num_stages=tile.num_stages,
        **pdl_launch(x),
    )  # fmt: skip
    return out if tile.split_k == 1 else out.to(x.dtype)


def quantize_rows_triton(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(q, scale)`` as ``quantize_rows``: ``x [M, K]`` in FP8, each row scaled so its
    largest magnitude maps to 448, and the float32 scales ``[M]``; one read of ``x``."""
    m, k = x.shape
    if x.stride(1) != 1:
        raise ValueError("quantize_rows_triton needs contiguous rows (last dimension)")
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m:
        block_k = triton.next_power_of_2(k)
        _quantize_rows_kernel[(m,)](
            x, q, scale, k, x.stride(0), q.stride(0), MIN_SCALE,
            BLOCK_K=block_k, FP8_LIMIT=FP8_MAX, INVERSE_LIMIT=INVERSE_FP8_MAX,
            num_warps=min(16, max(4, block_k // 1024)),
        )  # fmt: skip
    return q, scale
