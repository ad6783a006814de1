"""Triton gated activations: ``act(gate) * up`` from a fused ``[gate | up]`` row, in one pass."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.pdl import pdl_launch, wait_for_previous_kernel

_BLOCK = 1024
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


@triton.jit
def _gated_act_kernel(
    Out, X, n_cols, stride_o, stride_x, ACT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == "silu":
        act = gate * tl.sigmoid(gate)
    else:  # gelu, tanh approximation: 0.5 * (1 + tanh(u)) == sigmoid(2u)
        u = _SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * u)
    tl.store(Out + row * stride_o + cols, (act * up).to(Out.dtype.element_ty), mask=mask)


def _gated(x: Tensor, act: str) -> Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n_cols = x2.shape[1] // 2
    out = x2.new_empty(x2.shape[0], n_cols)
    if out.numel():
        grid = (x2.shape[0], triton.cdiv(n_cols, _BLOCK))
        _gated_act_kernel[grid](
            out, x2, n_cols, out.stride(0), x2.stride(0), ACT=act, BLOCK=_BLOCK,
            **pdl_launch(x2),
        )  # fmt: skip
    return out.view(*x.shape[:-1], n_cols)


def silu_and_mul_triton(x: Tensor) -> Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` → ``[..., I]``."""
    return _gated(x, "silu")


def gelu_tanh_and_mul_triton(x: Tensor) -> Tensor:
    """``gelu_tanh(x[..., :I]) * x[..., I:]`` → ``[..., I]`` (Gemma's MLP)."""
    return _gated(x, "gelu_tanh")
