"""The fused Triton rotary embedding and K/V cache write against the torch references
(``apply_rope_torch`` then ``write_kv_torch``), on strided views of a fused qkv."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.fp8 import FP8
from infer.kernels.kv_write import write_kv_torch
from infer.kernels.rope import apply_rope_torch
from infer.kernels.rope_kv_write_triton import rope_and_write_kv_triton


def cos_sin_cache(max_pos: int, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def fused_qkv(
    tokens: int, heads: tuple[int, int], head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``[T, heads, D]``: strided views of one fused qkv projection's output."""
    num_heads, num_kv_heads = heads
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim).to(dtype)
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    q, k, v = (
        t.view(tokens, n, head_dim) for t, n in zip(qkv.split(sizes, dim=1), (*heads, heads[1]))
    )
    return q, k, v


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "head_dim"), [((8, 2), 32), ((3, 1), 128), ((6, 6), 64)])
@pytest.mark.parametrize("block_size", [8, 16])
def test_rotates_q_in_place_and_writes_rotated_k_and_v_to_their_slots(
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    heads: tuple[int, int],
    head_dim: int,
    block_size: int,
) -> None:
    tokens, num_blocks = 7, 4
    q, k, v = fused_qkv(tokens, heads, head_dim, dtype)
    k_before, v_before = k.clone(), v.clone()
    positions = torch.tensor([0, 1, 5, 63, 64, 2, 100])
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[[2, 5]] = -1  # padding tokens are written nowhere
    cache = cos_sin_cache(128, head_dim)
    shape = (num_blocks, heads[1], block_size, head_dim)
    k_ref, v_ref = torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)
    k_out, v_out = k_ref.clone(), v_ref.clone()

    ref_q, ref_k = apply_rope_torch(q.clone(), k.clone(), positions, cache)
    write_kv_torch(ref_k, v, k_ref, v_ref, slots)
    out_q = rope_and_write_kv_triton(q, k, v, positions, cache, k_out, v_out, slots)

    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert out_q.data_ptr() == q.data_ptr()  # rotated in place
    torch.testing.assert_close(q, ref_q, atol=tol, rtol=tol)
    torch.testing.assert_close(k_out.float(), k_ref.float(), atol=tol, rtol=tol)
    assert torch.equal(v_out, v_ref)
    assert torch.equal(k, k_before) and torch.equal(v, v_before)  # only the cache gets them


def test_no_tokens_write_nothing() -> None:
    q, k, v = fused_qkv(0, (2, 1), 16, torch.float32)
    cache = torch.zeros(2, 1, 8, 16)
    rope_and_write_kv_triton(
        q, k, v, torch.empty(0, dtype=torch.int64), cos_sin_cache(8, 16), cache, cache,
        torch.empty(0, dtype=torch.int64),
    )  # fmt: skip
    assert not cache.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_fp8_cache_gets_k_and_v_divided_by_their_scales(dtype: torch.dtype) -> None:
    tokens, heads, head_dim, block_size, num_blocks = 5, (4, 2), 32, 8, 3
    q, k, v = fused_qkv(tokens, heads, head_dim, dtype)
    k, v = k * 30, v * 30  # past 448 once divided: the kernel must clamp, not overflow
    positions = torch.tensor([0, 3, 9, 17, 40])
    slots = torch.tensor([3, -1, 8, 23, 0])
    cache = cos_sin_cache(64, head_dim)
    scales = (0.25, 0.125)
    shape = (num_blocks, heads[1], block_size, head_dim)
    k_ref, v_ref = torch.zeros(shape, dtype=FP8), torch.zeros(shape, dtype=FP8)
    k_out, v_out = k_ref.clone(), v_ref.clone()

    _, ref_k = apply_rope_torch(q.clone(), k, positions, cache)  # rotated, in k's dtype
    write_kv_torch(ref_k, v, k_ref, v_ref, slots, kv_scales=scales)
    rope_and_write_kv_triton(q, k, v, positions, cache, k_out, v_out, slots, scales)

    assert torch.equal(v_out.view(torch.uint8), v_ref.view(torch.uint8))
    assert bool(v_out.float().abs().amax() == 448)  # clamped, not NaN
    # The rotation's products may round apart (a fused multiply-add) by one e4m3 step.
    torch.testing.assert_close(k_out.float(), k_ref.float(), rtol=2**-3, atol=2**-6)
    assert (k_out.view(torch.uint8) != k_ref.view(torch.uint8)).float().mean() < 0.01
    assert not k_out.float().isnan().any()
