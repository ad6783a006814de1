"""Triton RMSNorm and fused residual-add + RMSNorm: one read and one write of each row."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.pdl import pdl_launch, wait_for_previous_kernel


def _as_rows(x: Tensor) -> Tensor:
    """``[..., N]`` as ``[R, N]`` with unit column stride (a 2-D view keeps its row stride)."""
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _row_tile(n_cols: int) -> tuple[int, int, int]:
    """(rows per program, padded columns, warps): about 2-4K elements per program."""
    block_n = triton.next_power_of_2(n_cols)
    block_r = max(1, 2048 // block_n)
    num_warps = min(16, max(4, block_r * block_n // 1024))
    return block_r, block_n, num_warps


@triton.jit(do_not_specialize=["num_rows"])  # varies every step: compile once
def _rms_norm_kernel(
    Out,
    X,
    Residual,
    ResidualOut,
    W,
    num_rows,
    n_cols,
    stride_o,
    stride_x,
    stride_r,
    stride_ro,
    eps,
    offset,
    FUSE_ADD: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < num_rows)[:, None] & (cols < n_cols)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if FUSE_ADD:
        r = tl.load(Residual + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        # Round the sum to the input dtype first, as the unfused ``x + residual`` does.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(ResidualOut + rows[:, None] * stride_ro + cols[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 1) / n_cols + eps)
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32) + offset
    out = xf * inv_rms[:, None] * w[None, :]
    tl.store(
        Out + rows[:, None] * stride_o + cols[None, :], out.to(Out.dtype.element_ty), mask=mask
    )


def _launch(
    x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, offset: float
) -> tuple[Tensor, Tensor]:
    x2 = _as_rows(x)
    out = x2.new_empty(x2.shape)
    res2 = _as_rows(residual) if residual is not None else x2
    res_out = x2.new_empty(x2.shape) if residual is not None else out
    num_rows, n_cols = x2.shape
    block_r, block_n, num_warps = _row_tile(n_cols)
    _rms_norm_kernel[(triton.cdiv(num_rows, block_r),)](
        out, x2, res2, res_out, weight,
        num_rows, n_cols, out.stride(0), x2.stride(0), res2.stride(0), res_out.stride(0),
        eps, offset,
        FUSE_ADD=residual is not None, BLOCK_R=block_r, BLOCK_N=block_n,
        num_warps=num_warps, **pdl_launch(x2),
    )  # fmt: skip
    return out.view(x.shape), res_out.view(x.shape)


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """RMSNorm over the last dimension (fp32 math), scaled by ``weight + offset``."""
    return _launch(x, None, weight, eps, offset)[0]


def fused_add_rms_norm_triton(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float = 0.0
) -> tuple[Tensor, Tensor]:
    """``new_residual = x + residual``; returns ``(rms_norm(new_residual), new_residual)``."""
    return _launch(x, residual, weight, eps, offset)
