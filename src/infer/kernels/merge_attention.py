"""Two attentions of the same queries over disjoint key sets, merged into one.

Attention over keys ``A ∪ B`` is the outputs over ``A`` and over ``B`` weighted by each one's
share of the softmax mass: ``exp(lse_a)`` against ``exp(lse_b)`` (natural-log log-sum-exps
of the scaled scores). One pass over the two partial outputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer.kernels.dispatch import use_triton


def merge_attention(
    out: Tensor, out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor
) -> None:
    """``out [T, H, D]`` ← the merge of ``out_a, out_b [T, H, D]`` with log-sum-exps
    ``lse_a, lse_b [T, H]`` (float32); any strides with a contiguous last dimension."""
    if use_triton(out):
        from infer.kernels.merge_attention_triton import merge_attention_triton

        merge_attention_triton(out, out_a, lse_a, out_b, lse_b)
    else:
        out.copy_(merge_attention_torch(out_a, lse_a, out_b, lse_b))


def merge_attention_torch(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    """The reference: ``[T, H, D]`` in ``out_a``'s dtype."""
    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # neither saw a key
    weight_a, weight_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
    total = (weight_a + weight_b).clamp_min(torch.finfo(torch.float32).tiny)
    merged = out_a.float() * (weight_a / total)[..., None]
    merged += out_b.float() * (weight_b / total)[..., None]
    return merged.to(out_a.dtype)
