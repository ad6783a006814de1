"""FP8 quantisation per row and the W8A8 matmul: the CPU reference (the same math as
``torch._scaled_mm``), and on a GPU the ``_scaled_mm`` path against it."""

from __future__ import annotations

import pytest
import torch

from infer.models.fp8 import (
    FP8,
    FP8_MAX,
    dequantize_rows,
    fp8_linear,
    fp8_matmul_reference,
    quantize_rows,
)

# e4m3 keeps 3 mantissa bits: a normal value rounds to within 2**-4 of itself.
E4M3_RELATIVE = 2.0**-4


def test_each_row_maps_its_largest_magnitude_to_448() -> None:
    w = torch.randn(8, 64) * torch.logspace(-3, 3, 8).unsqueeze(1)  # rows of very unequal size
    q, scale = quantize_rows(w)
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (8,)
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((8,), FP8_MAX))
    torch.testing.assert_close(scale, w.abs().amax(dim=1) / FP8_MAX)


def test_dequantised_rows_are_within_e4m3_rounding() -> None:
    w = torch.randn(16, 128, dtype=torch.bfloat16)
    q, scale = quantize_rows(w)
    error = (dequantize_rows(q, scale) - w.float()).abs()
    # Normal values round relatively; those below e4m3's smallest normal by its spacing.
    bound = torch.maximum(w.float().abs() * E4M3_RELATIVE, scale.unsqueeze(1) * 2.0**-9)
    assert bool((error <= bound).all())


def test_an_all_zero_row_quantises_to_zeros() -> None:
    q, scale = quantize_rows(torch.zeros(2, 32))
    assert torch.equal(q.float(), torch.zeros(2, 32)) and bool(scale.isfinite().all())


def test_reference_matmul_is_the_product_of_the_dequantised_operands() -> None:
    x_q, sx = quantize_rows(torch.randn(5, 64))
    w_q, sw = quantize_rows(torch.randn(48, 64))
    dequantised = (x_q.float() * sx[:, None]) @ (w_q.float() * sw[:, None]).T
    torch.testing.assert_close(fp8_matmul_reference(x_q, sx, w_q, sw), dequantised)


def test_fp8_linear_scales_each_token_by_itself() -> None:
    """A tiny token beside a huge one keeps its precision (a per-tensor scale would
    flush it to zero)."""
    w = torch.randn(32, 64)
    x = torch.stack([torch.randn(64) * 1e-4, torch.randn(64) * 1e4])
    w_q, w_scale = quantize_rows(w)
    out = fp8_linear(x, w_q, w_scale)
    exact = x @ dequantize_rows(w_q, w_scale).T
    relative = (out - exact).norm(dim=1) / exact.norm(dim=1)
    assert bool((relative < 0.05).all()), relative


def test_fp8_linear_is_close_to_the_unquantised_product_in_the_input_dtype() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(7, 256, dtype=torch.bfloat16), torch.randn(64, 256, dtype=torch.bfloat16)
    out = fp8_linear(x, *quantize_rows(w))
    assert out.dtype == torch.bfloat16
    reference = x.float() @ w.float().T
    relative = (out.float() - reference).norm() / reference.norm()
    assert relative < 0.05


gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("tokens", [1, 7, 16, 257])
@pytest.mark.parametrize("shape", [(4096, 3072), (64, 48), (40, 24)])  # the last: no 16s
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("_", [pytest.param(None, marks=gpu)])
def test_scaled_mm_matches_the_reference(
    tokens: int, shape: tuple[int, int], dtype: torch.dtype, _: None
) -> None:
    torch.manual_seed(tokens)
    out_features, in_features = shape
    x = torch.randn(tokens, in_features, device="cuda", dtype=dtype)
    w_q, w_scale = quantize_rows(torch.randn(out_features, in_features, device="cuda"))
    ours = fp8_linear(x, w_q, w_scale)
    reference = fp8_matmul_reference(*quantize_rows(x), w_q, w_scale)
    assert ours.dtype == dtype
    # bfloat16 output rounding (8 bits), and the kernel's own accumulation order, whose
    # error grows with the sum's largest terms rather than with each output.
    atol = 2**-12 * reference.abs().max().item()
    torch.testing.assert_close(ours.float(), reference, rtol=2**-7, atol=atol)
