"""Merging two partial attentions by their log-sum-exps: torch and Triton (interpreted)."""

from __future__ import annotations

import torch

from infer.kernels.merge_attention import merge_attention_torch
from infer.kernels.merge_attention_triton import merge_attention_triton


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [T, H, D]`` over ``k, v [L, H, D]``: output and log-sum-exps ``[T, H]``."""
    scores = torch.einsum("thd,lhd->htl", q, k)
    out = torch.einsum("htl,lhd->thd", torch.softmax(scores, -1), v)
    return out, torch.logsumexp(scores, -1).transpose(0, 1)


def test_the_merge_of_two_key_sets_is_attention_over_their_union() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 3, 16, generator=gen)
    k, v = torch.randn(12, 3, 16, generator=gen), torch.randn(12, 3, 16, generator=gen)
    whole, _ = _attend(q, k, v)
    out_a, lse_a = _attend(q, k[:7], v[:7])
    out_b, lse_b = _attend(q, k[7:], v[7:])
    torch.testing.assert_close(merge_attention_torch(out_a, lse_a, out_b, lse_b), whole)


def test_triton_matches_torch_on_strided_inputs_and_rows_without_keys() -> None:
    gen = torch.Generator().manual_seed(1)
    tokens, heads, dim = 70, 3, 32
    out_a = torch.randn(heads, tokens, dim, generator=gen).transpose(0, 1)  # strided views
    out_b = torch.randn(tokens, heads, dim, generator=gen)
    lse_a = torch.randn(heads, tokens, generator=gen).transpose(0, 1)
    lse_b = torch.randn(tokens, heads, generator=gen) * 3
    lse_b[4] = float("-inf")  # token 4 saw no key in part b: part a alone
    lse_a[9, 1] = lse_b[9, 1] = float("-inf")  # and this one no key at all: zeros
    out_a[9, 1] = out_b[9, 1] = 0.0
    out = torch.empty(tokens, heads, dim)
    merge_attention_triton(out, out_a, lse_a, out_b, lse_b)
    expected = merge_attention_torch(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[4], out_a[4])
    assert out[9, 1].abs().max() == 0
