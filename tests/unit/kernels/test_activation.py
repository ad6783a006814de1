"""Triton gated activations against the torch references."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.activation import gelu_tanh_and_mul_torch, silu_and_mul_torch
from infer.kernels.activation_triton import gelu_tanh_and_mul_triton, silu_and_mul_triton

PAIRS = [
    (silu_and_mul_triton, silu_and_mul_torch),
    (gelu_tanh_and_mul_triton, gelu_tanh_and_mul_torch),
]


# exp overflows to inf for very negative gates under the interpreter; the sigmoid is still 0.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize(("kernel", "ref"), PAIRS, ids=["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(5, 2 * 40), (3, 2 * 1500), (2, 3, 2 * 64)])
def test_gated_activation(kernel, ref, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = (3 * torch.randn(shape)).to(dtype)
    out = kernel(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out, ref(x), atol=tol, rtol=tol)


@pytest.mark.parametrize(("kernel", "ref"), PAIRS, ids=["silu", "gelu_tanh"])
def test_gated_activation_of_strided_rows(kernel, ref) -> None:
    x = torch.randn(4, 2 * 2 * 48)[:, : 2 * 48]  # rows of a wider buffer
    assert not x.is_contiguous()
    torch.testing.assert_close(kernel(x), ref(x), atol=1e-5, rtol=1e-5)


def test_empty_batch() -> None:
    assert silu_and_mul_triton(torch.empty(0, 64)).shape == (0, 32)
