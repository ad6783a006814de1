"""Triton ``x @ weight.T`` for a few rows of ``x``: the weight read once, at bandwidth.

A decode step with a handful of rows is a matrix-vector product per projection; its time is
the weight's bytes over memory bandwidth. Each program owns ``block_n`` output features and
streams their weight rows along K (contiguous in an ``nn.Linear`` weight), so every byte is
read once with wide loads and nothing is staged for tensor cores. ``split_k`` programs can
share a feature block when there are too few blocks to keep every SM's loads in flight; the
last of them to finish (an atomic counter per block, reset by that program for the next
launch, so CUDA graphs replay it) adds the partial sums in split order: the result does not
depend on which program finished last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@dataclass(frozen=True)
class SkinnyConfig:
    """Tile of one program: ``block_n`` features by ``block_k`` of K a load; ``dot`` multiplies
    on tensor cores (the rows padded to 16), else in registers (rows padded to a power of 2)."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    dot: bool = False


@triton.jit
def _skinny_linear_kernel(
    Out,
    X,
    W,
    Partials,
    Arrivals,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < M
    col_in = cols < N
    k_per_split = K // SPLIT_K
    offs_k = tl.arange(0, BLOCK_K)
    ks = pid_k * k_per_split + offs_k
    x_ptrs = X + rows[:, None] * stride_xm + ks[None, :]
    w_ptrs = W + cols[:, None] * stride_wn + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # The weight does not depend on the kernel before: its first tile is read before waiting.
    w = tl.load(w_ptrs, mask=col_in[:, None], other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    for k in range(0, k_per_split, BLOCK_K):
        x = tl.load(x_ptrs, mask=row_in[:, None], other=0.0)
        more = (k + BLOCK_K + offs_k) < k_per_split
        w_next = tl.load(w_ptrs + BLOCK_K, mask=col_in[:, None] & more[None, :], other=0.0)
        if DOT:
            acc += tl.dot(x, tl.trans(w))
        else:
            acc += tl.sum(x[:, None, :].to(tl.float32) * w[None, :, :].to(tl.float32), axis=2)
        w = w_next
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ptrs = Out + rows[:, None] * stride_om + cols[None, :]
    out_mask = row_in[:, None] & col_in[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=out_mask)
    else:
        tile = rows[:, None] * N + cols[None, :]
        tl.store(Partials + pid_k * M * N + tile, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is written before the release below
        arrived = tl.atomic_add(Arrivals + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for split in range(SPLIT_K):
                part = Partials + split * M * N + tile
                total += tl.load(part, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(Out.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(Arrivals + pid_n, 0)


_ARRIVALS: dict[torch.device, Tensor] = {}
MAX_SPLIT_BLOCKS = 4096  # feature blocks that may split K (counters kept per device)


def _arrivals(device: torch.device) -> Tensor:
    """One zeroed counter per feature block, shared by every launch on the device (launches on
    a stream run one after another, and each leaves its counters at zero)."""
    if device not in _ARRIVALS:
        _ARRIVALS[device] = torch.zeros(MAX_SPLIT_BLOCKS, dtype=torch.int32, device=device)
    return _ARRIVALS[device]


def fits(x: Tensor, weight: Tensor, config: SkinnyConfig) -> bool:
    """Whether the kernel takes these operands with this tile (else use ``F.linear``)."""
    rows, k = x.shape
    blocks = triton.cdiv(weight.shape[0], config.block_n)
    return (
        x.dim() == 2
        and weight.is_contiguous()
        and x.stride(1) == 1
        and k % (config.block_k * config.split_k) == 0
        and (config.split_k == 1 or blocks <= MAX_SPLIT_BLOCKS)
    )


def skinny_linear_triton(
    x: Tensor, weight: Tensor, config: SkinnyConfig, pdl: bool = False
) -> Tensor:
    """``x @ weight.T`` (``x`` ``[M, K]`` with few rows, ``weight`` ``[N, K]``); see ``fits``."""
    m, k = x.shape
    n = weight.shape[0]
    out = x.new_empty(m, n)
    blocks = triton.cdiv(n, config.block_n)
    split = config.split_k
    partials = (
        torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else out
    )
    _skinny_linear_kernel[(blocks, split)](
        out, x, weight, partials, _arrivals(x.device),
        m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=max(16, triton.next_power_of_2(m)) if config.dot else triton.next_power_of_2(m),
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split, DOT=config.dot,
        PDL=pdl, num_warps=config.num_warps, **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out
