"""Triton K/V cache write against the torch reference."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.kv_write import write_kv_torch
from infer.kernels.kv_write_triton import write_kv_triton


@pytest.mark.parametrize("block_size", [8, 16, 24])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_write_kv_matches_reference(block_size: int, cache_dtype: torch.dtype) -> None:
    num_kv_heads, head_dim, tokens = 3, 32, 9
    qkv = torch.randn(tokens, (6 + 2 * num_kv_heads) * head_dim)  # k, v: strided views
    k = qkv[:, 6 * head_dim : (6 + num_kv_heads) * head_dim].view(tokens, num_kv_heads, head_dim)
    v = qkv[:, (6 + num_kv_heads) * head_dim :].view(tokens, num_kv_heads, head_dim)
    num_blocks = 6
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[[2, 5]] = -1  # padding rows are written nowhere
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    k_ref, v_ref = torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)
    k_out, v_out = k_ref.clone(), v_ref.clone()
    write_kv_torch(k, v, k_ref, v_ref, slots)
    write_kv_triton(k, v, k_out, v_out, slots)
    assert torch.equal(k_out, k_ref)
    assert torch.equal(v_out, v_ref)


def test_write_kv_no_tokens() -> None:
    cache = torch.zeros(2, 1, 8, 16)
    write_kv_triton(torch.empty(0, 1, 16), torch.empty(0, 1, 16), cache, cache, torch.empty(0))
    assert not cache.any()
