"""The reference backend against plain per-sequence attention."""

from __future__ import annotations

import math

import pytest
import torch

from infer.attention import ScheduledSequence, attend, build_metadata

# cos | sin with every angle 0: ``attend``'s rotary embedding leaves q and k as they are
NO_ROTATION = torch.cat([torch.ones(64, 4), torch.zeros(64, 4)], dim=-1)


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """q [Q, H, D] at the last Q positions of k, v [L, Hkv, D]."""
    length, heads = k.shape[0], q.shape[1]
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    qpos = torch.arange(length - q.shape[0], length)[:, None]
    kpos = torch.arange(length)[None, :]
    allowed = (kpos <= qpos) & ((qpos - kpos < window) if window else True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("window", [0, 5])
def test_ragged_batch_matches_per_sequence_attention(window: int) -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, block = 4, 2, 8, 4
    # (context already cached, new tokens): a prefill, a chunk, a decode, a prefix-cached one
    shapes = [(0, 9), (6, 3), (13, 1), (8, 5)]
    cache_k = torch.zeros(32, kv_heads, block, dim)
    cache_v = torch.zeros_like(cache_k)
    perm = torch.randperm(32).tolist()
    seqs, full_k, full_v, queries = [], [], [], []
    for i, (done, new) in enumerate(shapes):
        total = done + new
        blocks = perm[i * 6 : i * 6 + math.ceil(total / block)]
        k, v = torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
        for pos in range(done):  # earlier steps' K/V
            cache_k[blocks[pos // block], :, pos % block] = k[pos]
            cache_v[blocks[pos // block], :, pos % block] = v[pos]
        seqs.append(ScheduledSequence(blocks, done, [0] * new))
        full_k.append(k)
        full_v.append(v)
        queries.append(torch.randn(new, heads, dim))
    _, meta = build_metadata(seqs, block, torch.device("cpu"))
    new_k = torch.cat([k[d:] for k, (d, _) in zip(full_k, shapes)])
    new_v = torch.cat([v[d:] for v, (d, _) in zip(full_v, shapes)])
    out = attend(
        torch.cat(queries),
        new_k,
        new_v,
        cache_k,
        cache_v,
        meta,
        cos_sin=NO_ROTATION,
        scale=1 / math.sqrt(dim),
        sliding_window=window,
    )
    expected = torch.cat([_naive(q, k, v, window) for q, k, v in zip(queries, full_k, full_v)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_an_fp8_cache_is_written_scaled_and_read_dequantised() -> None:
    """K and V stored as ``x / scale`` in e4m3 and read back times the scale: the same
    attention as over the values those round to (K here exceeds e4m3's ±448 unscaled)."""
    torch.manual_seed(1)
    heads, kv_heads, dim, block, done, new = 4, 2, 8, 4, 6, 3
    kv_scales = (4.0, 0.5)
    k = torch.randn(done + new, kv_heads, dim) * 500
    v = torch.randn(done + new, kv_heads, dim)
    rounded_k = (k / kv_scales[0]).to(torch.float8_e4m3fn).float() * kv_scales[0]
    rounded_v = (v / kv_scales[1]).to(torch.float8_e4m3fn).float() * kv_scales[1]
    cache_k = torch.zeros(4, kv_heads, block, dim, dtype=torch.float8_e4m3fn)
    cache_v = torch.zeros_like(cache_k)
    blocks = [2, 0, 3]
    for pos in range(done):
        cache_k[blocks[pos // block], :, pos % block] = (k[pos] / kv_scales[0]).to(cache_k.dtype)
        cache_v[blocks[pos // block], :, pos % block] = (v[pos] / kv_scales[1]).to(cache_v.dtype)
    _, meta = build_metadata(
        [ScheduledSequence(blocks, done, [0] * new)], block, torch.device("cpu")
    )
    q = torch.randn(new, heads, dim) / 500
    out = attend(
        q, k[done:], v[done:], cache_k, cache_v, meta,
        cos_sin=NO_ROTATION, scale=1 / math.sqrt(dim), kv_scales=kv_scales,
    )  # fmt: skip
    torch.testing.assert_close(out, _naive(q, rounded_k, rounded_v, 0), atol=1e-5, rtol=1e-5)
