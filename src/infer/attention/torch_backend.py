"""Reference paged attention: gather each sequence's blocks, then one masked SDPA call.

Runs anywhere (it is the CPU path and the GPU fallback) and is what the Triton kernels are
tested against. The gather plan is built once per step and shared by all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from infer.attention.metadata import AttentionMetadata


@dataclass
class _GatherPlan:
    query_index: Tensor  # [B, Q] flat token row of each padded query slot
    query_valid: Tensor  # [B, Q]
    query_pos: Tensor  # [B, Q] absolute position of each padded query slot
    kv_blocks: Tensor  # [B, L] physical block of each context position
    kv_offsets: Tensor  # [B, L]
    kv_valid: Tensor  # [B, L]


def _plan(meta: AttentionMetadata, block_size: int) -> _GatherPlan:
    cached = meta.derived.get("torch_plan")
    if cached is not None:
        return cached
    device = meta.seq_lens.device
    starts = meta.query_start_loc.long()
    query_lens = starts[1:] - starts[:-1]
    seq_lens = meta.seq_lens.long()
    q_slot = torch.arange(max(meta.max_query_len, 1), device=device)
    query_valid = q_slot[None, :] < query_lens[:, None]
    query_index = torch.where(query_valid, starts[:-1, None] + q_slot[None, :], 0)
    query_pos = (seq_lens - query_lens)[:, None] + q_slot[None, :]
    kv_pos = torch.arange(max(meta.max_seq_len, 1), device=device)
    kv_blocks = meta.block_tables.long().gather(
        1, (kv_pos // block_size)[None, :].expand(len(seq_lens), -1).clamp(
            max=meta.block_tables.shape[1] - 1
        )
    )
    plan = _GatherPlan(
        query_index=query_index,
        query_valid=query_valid,
        query_pos=query_pos,
        kv_blocks=kv_blocks,
        kv_offsets=(kv_pos % block_size)[None, :].expand(len(seq_lens), -1),
        kv_valid=kv_pos[None, :] < seq_lens[:, None],
    )
    meta.derived["torch_plan"] = plan
    return plan


def _mask(meta: AttentionMetadata, plan: _GatherPlan, sliding_window: int) -> Tensor:
    key = f"torch_mask_{sliding_window}"
    cached = meta.derived.get(key)
    if cached is not None:
        return cached
    kv_pos = torch.arange(plan.kv_valid.shape[1], device=plan.kv_valid.device)
    distance = plan.query_pos[:, :, None] - kv_pos[None, None, :]
    mask = plan.kv_valid[:, None, :] & (distance >= 0)
    if sliding_window > 0:
        mask &= distance < sliding_window
    # Padding query rows attend to position 0 so SDPA never sees an all-masked row.
    mask[:, :, 0] |= ~plan.query_valid
    mask = mask[:, None]  # [B, 1, Q, L]
    meta.derived[key] = mask
    return mask


def paged_attention_torch(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int = 0,
) -> Tensor:
    """Attention of ``q [T, H, D]`` over the paged cache ``[N, Hkv, BS, D]`` → ``[T, H, D]``.

    The new tokens' K/V must already be written to the cache.
    """
    plan = _plan(meta, k_cache.shape[2])
    mask = _mask(meta, plan, sliding_window)
    q_pad = q[plan.query_index].transpose(1, 2)  # [B, H, Q, D]
    k = k_cache[plan.kv_blocks, :, plan.kv_offsets, :].transpose(1, 2)  # [B, Hkv, L, D]
    v = v_cache[plan.kv_blocks, :, plan.kv_offsets, :].transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q_pad, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    out = out.transpose(1, 2)  # [B, Q, H, D]
    return out[plan.query_valid]
