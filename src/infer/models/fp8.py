"""FP8 (e4m3) weights with per-output-channel scales, activations scaled per token (W8A8).

A weight row is stored as ``q[n] = w[n] / s[n]`` in ``float8_e4m3fn`` with
``s[n] = amax(|w[n]|) / 448``; at run time each token's activations get a scale of their
own the same way, and ``x @ w.T ≈ s_x * (q_x @ q_w.T) * s_w``. On CUDA that is one
``torch._scaled_mm``; elsewhere, and for shapes it cannot take, the same math runs on the
operands widened to float32: the reference the GPU path is tested against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer.kernels.fp8 import FP8, FP8_MAX, to_fp8

__all__ = ["FP8", "FP8_MAX", "dequantize_rows", "fp8_linear", "quantize_rows"]
# An all-zero row gets this scale instead of 0, so quantising it divides by something.
_MIN_SCALE = 1e-12
# ``_scaled_mm`` takes K and N that are multiples of 16 (M is free).
_SCALED_MM_ALIGN = 16


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(q, scale)``: ``x`` ``[..., K]`` in FP8, each row scaled so its largest magnitude
    maps to 448, and the float32 scales ``[...]`` (``x ≈ q * scale[..., None]``)."""
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=_MIN_SCALE) / FP8_MAX
    return to_fp8(x, scale), scale.squeeze(-1)


def dequantize_rows(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``q * scale[..., None]`` in ``dtype``."""
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)


def fp8_linear(x: Tensor, weight: Tensor, weight_scale: Tensor) -> Tensor:
    """``x @ weight.T`` in ``x``'s dtype, with ``x`` ``[T, K]`` quantised per token and
    ``weight`` ``[N, K]`` FP8 with float32 row scales ``[N]``."""
    x_q, x_scale = quantize_rows(x)
    if x.is_cuda and _fits_scaled_mm(weight):
        # Row-wise scaling produces bfloat16 only; ``weight.t()`` is the column-major
        # second operand the kernel wants, without a copy.
        out = torch._scaled_mm(
            x_q,
            weight.t(),
            scale_a=x_scale.unsqueeze(1),
            scale_b=weight_scale.unsqueeze(0),
            out_dtype=torch.bfloat16,
        )
        return out.to(x.dtype)
    return fp8_matmul_reference(x_q, x_scale, weight, weight_scale).to(x.dtype)


def fp8_matmul_reference(x_q: Tensor, x_scale: Tensor, w_q: Tensor, w_scale: Tensor) -> Tensor:
    """What ``_scaled_mm`` computes, in float32: the FP8 product (each term exact in
    float32), then the row scales of both operands."""
    return (x_q.float() @ w_q.float().T) * x_scale.unsqueeze(1) * w_scale.unsqueeze(0)


def _fits_scaled_mm(weight: Tensor) -> bool:
    n, k = weight.shape
    return n % _SCALED_MM_ALIGN == 0 and k % _SCALED_MM_ALIGN == 0
