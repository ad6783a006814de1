"""Reference paged attention: gather each sequence's blocks, then one masked SDPA call.

Runs anywhere (it is the CPU path and the GPU fallback) and is what the Triton kernels are
tested against. The gather plan is built once per step and shared by all layers (so is its
one host synchronisation, finding the rows that exist); blocks are gathered whole
(``index_select`` over the block dimension), which is far cheaper than indexing token by
token. Like the Triton kernels it serves padded steps: rows without tokens, and tokens that
belong to no row (their output is zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from infer.attention.metadata import AttentionMetadata
from infer.kernels.fp8 import FP8, indexable
from infer.kernels.kv_write import write_kv_torch


@dataclass
class _GatherPlan:
    query_index: Tensor  # [B, Q] flat token row of each padded query slot
    query_valid: Tensor  # [B, Q]
    valid_slots: Tensor  # [n] flat indices of the valid query slots (n tokens in rows)
    written_rows: Tensor  # token rows whose K/V is written (slot >= 0)
    query_pos: Tensor  # [B, Q] absolute position of each padded query slot
    blocks: Tensor  # [B * W] physical blocks to gather, W = blocks of the longest sequence
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
    width = max(1, min(math.ceil(meta.max_seq_len / block_size), meta.block_tables.shape[1]))
    kv_pos = torch.arange(width * block_size, device=device)
    plan = _GatherPlan(
        query_index=torch.where(query_valid, starts[:-1, None] + q_slot[None, :], 0),
        query_valid=query_valid,
        valid_slots=query_valid.flatten().nonzero().squeeze(1),
        written_rows=(meta.slot_mapping >= 0).nonzero().squeeze(1),
        query_pos=(seq_lens - query_lens)[:, None] + q_slot[None, :],
        blocks=meta.block_tables[:, :width].reshape(-1).long(),
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


def _gather(cache: Tensor, plan: _GatherPlan) -> Tensor:
    """``[B, Hkv, W * BS, D]``: each sequence's blocks laid end to end."""
    rows = plan.kv_valid.shape[0]
    # [B * W, Hkv, BS, D]
    blocks = indexable(cache).index_select(0, plan.blocks).view(cache.dtype)
    _, heads, block_size, dim = blocks.shape
    blocks = blocks.view(rows, -1, heads, block_size, dim).transpose(1, 2)
    return blocks.reshape(rows, heads, -1, dim)


def write_kv_planned(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> None:
    """``write_kv_torch`` with the written rows found once per step, not once per layer."""
    rows = _plan(meta, k_cache.shape[2]).written_rows
    write_kv_torch(k, v, k_cache, v_cache, meta.slot_mapping, rows, kv_scales)


def paged_attention_torch(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int = 0,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> Tensor:
    """Attention of ``q [T, H, D]`` over the paged cache ``[N, Hkv, BS, D]`` → ``[T, H, D]``.

    The new tokens' K/V must already be written to the cache. An FP8 cache is read
    dequantised: its values times ``kv_scales`` (one per tensor, K and V).
    """
    plan = _plan(meta, k_cache.shape[2])
    mask = _mask(meta, plan, sliding_window)
    q_pad = q[plan.query_index].transpose(1, 2)  # [B, H, Q, D]
    k = _gather(k_cache, plan).to(q.dtype)
    v = _gather(v_cache, plan).to(q.dtype)
    if k_cache.dtype == FP8:
        k, v = k * kv_scales[0], v * kv_scales[1]
    out = F.scaled_dot_product_attention(
        q_pad, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    heads, dim = out.shape[1], out.shape[3]
    rows = out.transpose(1, 2).reshape(-1, heads, dim).index_select(0, plan.valid_slots)
    return F.pad(rows, (0, 0, 0, 0, 0, q.shape[0] - rows.shape[0]))  # [T, H, D]
