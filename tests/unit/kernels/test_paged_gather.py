"""A sequence's K/V gathered from the paged cache: torch and Triton (interpreted)."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.fp8 import FP8
from infer.kernels.paged_gather import gather_torch
from infer.kernels.paged_gather_triton import gather_kv_triton

BLOCK = 16


def test_gather_lays_a_sequence_end_to_end_and_dequantises_fp8() -> None:
    cache = torch.randn(6, 2, BLOCK, 8)
    blocks = torch.tensor([4, 1, 3])
    expected = torch.cat([cache[4], cache[1], cache[3]], dim=1)[:, :40]
    gathered = gather_torch(cache, blocks, 40, torch.float32, 1.0)
    torch.testing.assert_close(gathered, expected)
    assert gathered.stride() == (8, 16, 1)  # token-major, as the Triton kernel's
    scaled = gather_torch((cache / 2).to(FP8), blocks, 40, torch.float32, 2.0)
    torch.testing.assert_close(scaled, expected, atol=0.25, rtol=0.07)


@pytest.mark.parametrize("length", [33, 48, 1])
@pytest.mark.parametrize("fp8", [False, True])
def test_triton_matches_torch(length: int, fp8: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(7, 2, BLOCK, 32, generator=gen)
    v_cache = torch.randn(7, 2, BLOCK, 32, generator=gen)
    scales = (2.0, 0.5) if fp8 else (1.0, 1.0)
    if fp8:
        k_cache, v_cache = (k_cache / 2).to(FP8), (v_cache * 2).to(FP8)
    blocks = torch.tensor([5, 0, 6])[: -(-length // BLOCK)]
    k, v = gather_kv_triton(k_cache, v_cache, blocks, length, torch.float32, scales)
    assert k.shape == v.shape == (2, length, 32)
    assert k.stride() == v.stride() == (32, 64, 1)  # token-major: a slice's strides are fixed
    torch.testing.assert_close(k, gather_torch(k_cache, blocks, length, torch.float32, scales[0]))
    torch.testing.assert_close(v, gather_torch(v_cache, blocks, length, torch.float32, scales[1]))
