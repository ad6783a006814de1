"""RMSNorm and fused residual-add + RMSNorm (``offset=1`` gives Gemma's ``(1 + w)`` scale)."""

from __future__ import annotations

import torch
from torch import Tensor

from infer.kernels.dispatch import use_triton


def rms_norm_torch(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """Reference: normalise the last dimension in float32, scale by ``weight + offset``."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (weight.float() + offset)).to(x.dtype)


def fused_add_rms_norm_torch(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Reference: ``residual = x + residual``; returns ``(rms_norm(residual), residual)``."""
    summed = x + residual
    return rms_norm_torch(summed, weight, eps, offset), summed


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    if use_triton(x):
        from infer.kernels.rms_norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps, offset)
    return rms_norm_torch(x, weight, eps, offset)


def fused_add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float = 0.0
) -> tuple[Tensor, Tensor]:
    if use_triton(x):
        from infer.kernels.rms_norm_triton import fused_add_rms_norm_triton

        return fused_add_rms_norm_triton(x, residual, weight, eps, offset)
    return fused_add_rms_norm_torch(x, residual, weight, eps, offset)
