"""Triton rotary embedding against the torch reference, on strided views of a fused qkv."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.rope import apply_rope_torch
from infer.kernels.rope_triton import apply_rope_triton


def cos_sin_cache(max_pos: int, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "head_dim"), [((8, 2), 32), ((3, 1), 128), ((6, 6), 64)])
def test_rope_on_fused_qkv_views(dtype: torch.dtype, heads: tuple[int, int], head_dim: int) -> None:
    num_heads, num_kv_heads = heads
    tokens, width = 7, (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(tokens, width).to(dtype)
    q = qkv[:, : num_heads * head_dim].view(tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        tokens, num_kv_heads, head_dim
    )
    v_before = qkv[:, (num_heads + num_kv_heads) * head_dim :].clone()
    positions = torch.tensor([0, 1, 5, 63, 64, 2, 100])
    cache = cos_sin_cache(128, head_dim)
    ref_q, ref_k = apply_rope_torch(q.clone(), k.clone(), positions, cache)
    out_q, out_k = apply_rope_triton(q, k, positions, cache)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out_q, ref_q, atol=tol, rtol=tol)
    torch.testing.assert_close(out_k, ref_k, atol=tol, rtol=tol)
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim :], v_before)  # v untouched
