"""Triton RMSNorm and fused residual-add + RMSNorm against the torch references."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.rms_norm import fused_add_rms_norm_torch, rms_norm_torch
from infer.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton

DTYPES = [torch.float32, torch.float16]


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 96), (3, 1000), (2, 5, 64), (1, 4096)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm(dtype: torch.dtype, shape: tuple[int, ...], offset: float) -> None:
    x = torch.randn(shape).to(dtype)
    weight = torch.randn(shape[-1])
    out = rms_norm_triton(x, weight, 1e-6, offset)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, rms_norm_torch(x, weight, 1e-6, offset), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_per_head_of_strided_view(dtype: torch.dtype) -> None:
    """Qwen3's q/k norm: the last dim of a [T, H, D] view into a fused projection."""
    fused = torch.randn(6, 3 * 64).to(dtype)
    q = fused[:, 64:].view(6, 2, 64)
    weight = torch.randn(64).to(dtype)
    expected = rms_norm_torch(q, weight, 1e-5)
    torch.testing.assert_close(rms_norm_triton(q, weight, 1e-5), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_fused_add_rms_norm(dtype: torch.dtype, offset: float) -> None:
    x, residual = torch.randn(9, 320).to(dtype), torch.randn(9, 320).to(dtype)
    weight = torch.randn(320)
    x_before, residual_before = x.clone(), residual.clone()
    normed, summed = fused_add_rms_norm_triton(x, residual, weight, 1e-6, offset)
    ref_normed, ref_summed = fused_add_rms_norm_torch(
        x_before, residual_before, weight, 1e-6, offset
    )
    torch.testing.assert_close(summed, ref_summed, atol=0, rtol=0)
    torch.testing.assert_close(normed, ref_normed, **tol(dtype))
