"""The FP8 linear kernels against their torch references (Triton interpreter on CPU): the
W8A16 product on every path (CUDA-core sums, dots, split K, ragged edges) and the fused
per-row quantisation, bit for bit."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import CUDA_PARAM

from infer.kernels.fp8_linear_triton import (
    W8A16Tile,
    quantize_rows_triton,
    w8a16_linear_triton,
    w8a16_tile,
)
from infer.models.fp8 import quantize_rows, w8a16_reference

# The interpreter's bfloat16 ``tl.dot`` multiplies the raw bits: dots are checked in float16
# and float32 here, bfloat16 on a GPU (tests/gpu).
TILES = [
    pytest.param(W8A16Tile(1, 16, 32), torch.bfloat16, id="sum-1-row-bf16"),
    pytest.param(W8A16Tile(4, 8, 64), torch.float32, id="sum-4-rows"),
    pytest.param(W8A16Tile(16, 16, 32), torch.float16, id="dot-16-rows-fp16"),
    pytest.param(W8A16Tile(16, 32, 32), torch.float32, id="dot-16-rows-fp32"),
    pytest.param(W8A16Tile(1, 16, 32, split_k=2), torch.float32, id="split-k"),
]


@pytest.mark.parametrize(("tile", "dtype"), TILES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 48, 128), (3, 40, 96), (19, 32, 64)])
def test_w8a16_matches_the_reference_on_ragged_shapes(
    tile: W8A16Tile, dtype: torch.dtype, m: int, n: int, k: int
) -> None:
    if tile.split_k > 1 and k % (tile.split_k * tile.block_k):
        pytest.skip("split K needs whole blocks")
    torch.manual_seed(m * n + k)
    x = torch.randn(m, k).to(dtype)
    w_q, w_scale = quantize_rows(torch.randn(n, k) * torch.logspace(-2, 2, n)[:, None])
    out = w8a16_linear_triton(x, w_q, w_scale, tile)
    reference = w8a16_reference(x, w_q, w_scale)
    assert out.dtype == dtype and out.shape == (m, n)
    # Rounded once to the output dtype; the float32 sums differ in order only.
    rtol = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(out.float(), reference, rtol=rtol, atol=rtol * reference.abs().max())


def test_w8a16_reads_strided_rows() -> None:
    """A view whose rows are further apart than K (a slice of a wider activation)."""
    wide = torch.randn(2, 160)
    x = wide[:, :96]
    w_q, w_scale = quantize_rows(torch.randn(24, 96))
    out = w8a16_linear_triton(x, w_q, w_scale, W8A16Tile(2, 8, 32))
    torch.testing.assert_close(out, w8a16_reference(x, w_q, w_scale), rtol=1e-5, atol=1e-5)


def test_split_k_refuses_a_k_it_cannot_divide() -> None:
    w_q, w_scale = quantize_rows(torch.randn(16, 96))
    with pytest.raises(ValueError, match="split_k"):
        w8a16_linear_triton(torch.randn(1, 96), w_q, w_scale, W8A16Tile(1, 16, 64, split_k=2))


@pytest.mark.parametrize("n", [3072, 5120, 16384])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 300])
def test_every_row_count_gets_a_tile_that_covers_its_rows(m: int, n: int) -> None:
    tile = w8a16_tile(m, n, 3072)
    if tile.block_m < 16:  # the CUDA-core sum: one program holds all the rows
        assert tile.block_m == m <= 2
    assert tile.split_k == 1  # (no atomics or extra launches inside a step)


@pytest.mark.parametrize("device", ["cpu", CUDA_PARAM])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_quantisation_is_bit_for_bit_the_torch_one(dtype: torch.dtype, device: str) -> None:
    torch.manual_seed(0)
    x = (torch.randn(6, 3000) * torch.logspace(-3, 3, 6)[:, None]).to(dtype).to(device)
    x[3] = 0  # an all-zero row gets a finite scale and zeros
    q, scale = quantize_rows_triton(x)
    q_ref, scale_ref = quantize_rows(x)
    assert q.dtype == q_ref.dtype and scale.dtype == torch.float32
    torch.testing.assert_close(scale, scale_ref, rtol=0, atol=0)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_fused_quantisation_of_no_rows() -> None:
    q, scale = quantize_rows_triton(torch.empty(0, 64))
    assert q.shape == (0, 64) and scale.shape == (0,)
