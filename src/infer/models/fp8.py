"""FP8 (e4m3) weights with per-output-channel scales: W8A16 for a few rows, W8A8 for many.

A weight row is stored as ``q[n] = w[n] / s[n]`` in ``float8_e4m3fn`` with
``s[n] = amax(|w[n]|) / 448``. Two ways to multiply by it, chosen by the row count M (a
shape, so a CUDA graph captures one of them):

* **W8A16**, ``M <= W8A16_MAX_ROWS``: ``x @ (q * s).T`` with ``x`` as it is. A step of few
  rows is bound by reading the weights; a Triton kernel reads the FP8 bytes once and widens
  them in registers, and the scales come after the sum.
* **W8A8**, more rows: each token's activations get a scale of their own the same way, and
  ``x @ w.T ≈ s_x * (q_x @ q_w.T) * s_w``: one ``torch._scaled_mm`` (FP8 tensor cores) after
  one Triton pass that quantises the rows.

Elsewhere (the CPU), and for shapes ``_scaled_mm`` cannot take, the same math runs on the
operands widened to float32: the reference the GPU paths are tested against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer.kernels.dispatch import use_triton
from infer.kernels.fp8 import FP8, FP8_MAX, INVERSE_FP8_MAX, MIN_SCALE, to_fp8

__all__ = [
    "FP8",
    "FP8_MAX",
    "W8A16_MAX_ROWS",
    "dequantize_rows",
    "fp8_linear",
    "fp8_matmul_reference",
    "quantize_rows",
    "w8a16_reference",
]
# Steps of at most this many rows read FP8 weights in the W8A16 kernel, larger ones go
# through ``_scaled_mm`` (measured switch point: benchmarks/results-by-topic/11-fp8.md, 11.2).
W8A16_MAX_ROWS = 16
# ``_scaled_mm`` takes K and N that are multiples of 16 (M is free).
_SCALED_MM_ALIGN = 16


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(q, scale)``: ``x`` ``[..., K]`` in FP8, each row scaled so its largest magnitude
    maps to 448, and the float32 scales ``[...]`` (``x ≈ q * scale[..., None]``)."""
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=MIN_SCALE) * INVERSE_FP8_MAX
    return to_fp8(x, scale), scale.squeeze(-1)


def dequantize_rows(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``q * scale[..., None]`` in ``dtype``."""
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)


def fp8_linear(
    x: Tensor, weight: Tensor, weight_scale: Tensor, *, w8a16_max_rows: int | None = None
) -> Tensor:
    """``x @ weight.T`` in ``x``'s dtype, for ``x [..., K]`` and ``weight [N, K]`` FP8 with
    float32 row scales ``[N]``: W8A16 up to ``w8a16_max_rows`` rows (default
    ``W8A16_MAX_ROWS``), W8A8 (activations quantised per token) above."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    limit = W8A16_MAX_ROWS if w8a16_max_rows is None else w8a16_max_rows
    few = rows.shape[0] <= limit
    if use_triton(x):
        from infer.kernels.fp8_linear_triton import (
            quantize_rows_triton,
            w8a16_linear_triton,
            w8a16_tile,
        )

        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        if few or not _fits_scaled_mm(weight):
            n = weight.shape[0]
            out = w8a16_linear_triton(rows, weight, weight_scale, w8a16_tile(rows.shape[0], n, k))
        else:
            x_q, x_scale = quantize_rows_triton(rows)
            # Row-wise scaling produces bfloat16 only; ``weight.t()`` is the column-major
            # second operand the kernel wants, without a copy.
            out = torch._scaled_mm(
                x_q,
                weight.t(),
                scale_a=x_scale.unsqueeze(1),
                scale_b=weight_scale.unsqueeze(0),
                out_dtype=torch.bfloat16,
            ).to(x.dtype)
    elif few:
        out = w8a16_reference(rows, weight, weight_scale).to(x.dtype)
    else:
        out = fp8_matmul_reference(*quantize_rows(rows), weight, weight_scale).to(x.dtype)
    return out.reshape(*lead, weight.shape[0])


def w8a16_reference(x: Tensor, w_q: Tensor, w_scale: Tensor) -> Tensor:
    """What the W8A16 kernel computes, in float32: ``x`` times the FP8 weight, then the
    weight's row scales."""
    return (x.float() @ w_q.float().T) * w_scale.unsqueeze(0)


def fp8_matmul_reference(x_q: Tensor, x_scale: Tensor, w_q: Tensor, w_scale: Tensor) -> Tensor:
    """What ``_scaled_mm`` computes, in float32: the FP8 product (each term exact in
    float32), then the row scales of both operands."""
    return (x_q.float() @ w_q.float().T) * x_scale.unsqueeze(1) * w_scale.unsqueeze(0)


def _fits_scaled_mm(weight: Tensor) -> bool:
    n, k = weight.shape
    return n % _SCALED_MM_ALIGN == 0 and k % _SCALED_MM_ALIGN == 0
