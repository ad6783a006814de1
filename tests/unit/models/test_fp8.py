"""FP8 quantisation per row and the two matmuls: W8A16 for a few rows, W8A8 for many. The
CPU references (the math of the W8A16 kernel and of ``torch._scaled_mm``), and on a GPU
each path against its reference."""

from __future__ import annotations

import pytest
import torch

from infer.models.fp8 import (
    FP8,
    FP8_MAX,
    W8A16_MAX_ROWS,
    dequantize_rows,
    fp8_linear,
    fp8_matmul_reference,
    quantize_rows,
    w8a16_reference,
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
    out = fp8_linear(x, w_q, w_scale, w8a16_max_rows=0)  # W8A8 even for two rows
    exact = x @ dequantize_rows(w_q, w_scale).T
    relative = (out - exact).norm(dim=1) / exact.norm(dim=1)
    assert bool((relative < 0.05).all()), relative


@pytest.mark.parametrize("w8a16_max_rows", [0, 16])
def test_fp8_linear_is_close_to_the_unquantised_product_in_the_input_dtype(
    w8a16_max_rows: int,
) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(7, 256, dtype=torch.bfloat16), torch.randn(64, 256, dtype=torch.bfloat16)
    out = fp8_linear(x, *quantize_rows(w), w8a16_max_rows=w8a16_max_rows)
    assert out.dtype == torch.bfloat16
    reference = x.float() @ w.float().T
    relative = (out.float() - reference).norm() / reference.norm()
    assert relative < 0.05


def test_few_rows_keep_their_activations_and_many_rows_quantise_them() -> None:
    torch.manual_seed(1)
    w_q, w_scale = quantize_rows(torch.randn(32, 64))
    x = torch.randn(5, 64)
    few = fp8_linear(x, w_q, w_scale, w8a16_max_rows=5)
    many = fp8_linear(x, w_q, w_scale, w8a16_max_rows=4)
    torch.testing.assert_close(few, w8a16_reference(x, w_q, w_scale))
    torch.testing.assert_close(many, fp8_matmul_reference(*quantize_rows(x), w_q, w_scale))
    assert not torch.equal(few, many)


def test_fp8_linear_keeps_leading_dimensions() -> None:
    w_q, w_scale = quantize_rows(torch.randn(24, 32))
    x = torch.randn(2, 3, 32)
    out = fp8_linear(x, w_q, w_scale)
    assert out.shape == (2, 3, 24)
    torch.testing.assert_close(out, fp8_linear(x.reshape(6, 32), w_q, w_scale).reshape(2, 3, 24))


gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("tokens", [1, 2, 3, 7, 8, 16, 17, 64, 257])
@pytest.mark.parametrize("shape", [(4096, 3072), (64, 48), (40, 24)])  # the last: no 16s
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("_", [pytest.param(None, marks=gpu)])
def test_gpu_paths_match_their_references(
    tokens: int, shape: tuple[int, int], dtype: torch.dtype, _: None
) -> None:
    """W8A16 (Triton) up to ``W8A16_MAX_ROWS`` rows or where ``_scaled_mm`` cannot take the
    shape, W8A8 (fused quantisation, then ``_scaled_mm``) above."""
    torch.manual_seed(tokens)
    out_features, in_features = shape
    x = torch.randn(tokens, in_features, device="cuda", dtype=dtype)
    w_q, w_scale = quantize_rows(torch.randn(out_features, in_features, device="cuda"))
    ours = fp8_linear(x, w_q, w_scale)
    if tokens <= W8A16_MAX_ROWS or in_features % 16 or out_features % 16:
        reference = w8a16_reference(x, w_q, w_scale)
    else:
        reference = fp8_matmul_reference(*quantize_rows(x), w_q, w_scale)
    assert ours.dtype == dtype
    # bfloat16 output rounding (8 bits), and the kernel's own accumulation order, whose
    # error grows with the sum's largest terms rather than with each output.
    atol = 2**-12 * reference.abs().max().item()
    torch.testing.assert_close(ours.float(), reference, rtol=2**-7, atol=atol)
