"""Long prompt chunks through torch's fused attention; the rest of the step stays on Triton.

The Triton prefill kernel reaches about half the rate of cuDNN's attention on an H100
(``benchmarks/results-by-topic/07-kernels.md``, 7.3, and ``14-long-context.md``), and a
chunk of thousands of tokens spends most of its step in attention. Rows with at least
``LONG_ROW_TOKENS`` new tokens ("long rows") are taken out of the Triton kernels' row lists
(a second ``row_order`` / ``row_counts``), and each runs here:

* its keys and values, cached prefix and its own, are gathered from the paged pool into
  ``[Hkv, L, D]`` views of token-major storage (``kernels.paged_gather``: one copy);
* with FlashAttention-4 installed (``attention.flash_attn4``), one causal call over them;
* else, through cuDNN: without a prefix, one causal call; with one, the chunk against its own
  keys (causal) and against the prefix (no mask), merged by their log-sum-exps
  (``kernels.merge_attention``).

Both kernels read the KV heads as they are (grouped-query attention), so neither keys nor
queries are copied per head.

Only eager steps carry a plan (``build_metadata``; steps this large run outside CUDA graphs).
Layers with a sliding window (Gemma 3's local layers) take FlashAttention-4 too, over the keys
their window reaches (the gather starts at the block of the first query's first visible key);
without it they keep the Triton kernel, which skips the keys outside the window.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from infer.attention.flash_attn4 import causal_attention, flash_attn4_available
from infer.kernels.dispatch import triton_enabled
from infer.kernels.merge_attention import merge_attention
from infer.kernels.paged_gather import gather_kv

if TYPE_CHECKING:
    from infer.attention.metadata import AttentionMetadata, HostBatch

# Rows with this many new tokens or more take the fused path
# (benchmarks/results-by-topic/14-long-context.md).
LONG_ROW_TOKENS = 1024


def long_rows_from(enabled: bool, device: torch.device) -> int:
    """The new tokens from which an eager step's row takes this path on ``device`` (0:
    none): the Triton devices' steps, unless turned off (``use_sdpa_prefill``)."""
    return LONG_ROW_TOKENS if enabled and triton_enabled(device) else 0


def workspace_bytes(
    heads: tuple[int, int, int], context: int, tokens: int, element_size: int
) -> int:
    """Memory one layer's long rows hold beyond an unchunked prefill of ``tokens`` tokens,
    at most: the gathered K/V of a ``context``-token sequence and the two parts' outputs
    (``heads``: query heads, KV heads, head_dim)."""
    num_heads, num_kv_heads, head_dim = heads
    return element_size * head_dim * (2 * num_kv_heads * context + 2 * num_heads * tokens)


@dataclass
class LongRow:
    """One long row of a step: query rows ``[start, start + length)``, after ``prefix``
    cached tokens, its K/V in ``blocks`` (the first ``ceil((prefix + length) / block size)``
    entries of its block table, on the device)."""

    start: int
    length: int
    prefix: int
    blocks: Tensor


@dataclass
class LongPrefill:
    """A step's long rows, and the view of its other rows the Triton kernels read (None when
    every row with tokens is long)."""

    rows: list[LongRow]
    rest: AttentionMetadata | None


def plan_long_prefill(
    host: HostBatch, meta: AttentionMetadata, block_size: int, min_tokens: int
) -> LongPrefill | None:
    """The long rows of a step (``min_tokens`` new tokens or more) and the Triton view of
    the others; None when no row is long. One host-to-device copy."""
    starts = host.query_start_loc
    query_lens = np.diff(starts)
    long = np.flatnonzero(query_lens >= min_tokens)
    if long.size == 0:
        return None
    tables = [host.block_tables[r, : math.ceil(host.seq_lens[r] / block_size)] for r in long]
    # Long rows leave the Triton kernels' lists: decode rows, the other prefill rows, rows
    # without tokens, then the long ones (past the counts, never read).
    kinds = np.where(query_lens == 1, 0, np.where(query_lens > 1, 1, 2))
    kinds[long] = 3
    row_order = np.argsort(kinds, kind="stable")
    row_counts = np.array([np.sum(kinds == 0), np.sum(kinds == 1)])
    token_rows = host.token_rows.copy()
    token_rows[np.isin(token_rows, long)] = -1
    # Each table padded to an even length, so that every one starts 16 bytes into the copy:
    # the gather kernel then meets the pointer alignment its warm-up compiled for.
    padded = [np.pad(t, (0, len(t) % 2)) for t in tables]
    packed = np.concatenate([*padded, row_order, row_counts, token_rows]).astype(np.int64)
    device = torch.from_numpy(packed).to(meta.seq_lens.device, non_blocking=True)
    sizes = [len(t) for t in padded] + [len(row_order), 2, len(token_rows)]
    *blocks, order, counts, owners = torch.split(device, sizes)
    rows = [
        LongRow(
            int(starts[r]), int(query_lens[r]), int(host.seq_lens[r] - query_lens[r]), b[: len(t)]
        )
        for r, b, t in zip(long, blocks, tables, strict=True)
    ]
    others = kinds < 3
    rest = None
    if np.any(query_lens[others] > 0):
        rest = dataclasses.replace(
            meta,
            row_order=order.int(),
            row_counts=counts.int(),
            token_rows=owners.int(),
            max_query_len=int(query_lens[others].max()),
            max_seq_len=int(host.seq_lens[others].max()),
            derived={},
            long_prefill=None,
        )
    return LongPrefill(rows, rest)


def takes_long_path(q: Tensor, sliding_window: int) -> bool:
    """Whether a layer runs its long rows here: in a half-precision dtype the fused kernels
    take, with full attention or through FlashAttention-4 (cuDNN's path has no window; a
    window there keeps the Triton kernel)."""
    windowed = sliding_window > 0 and not flash_attn4_available(q.device)
    return not windowed and q.dtype in (torch.float16, torch.bfloat16)


def long_prefill_attention(
    out: Tensor,
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    rows: list[LongRow],
    scale: float,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    sliding_window: int = 0,
) -> None:
    """Attention of each long row's queries (rows of ``q [T, H, D]``) over its context in the
    paged cache ``[N, Hkv, BS, D]`` (this step's K/V already written), into ``out``; with a
    ``sliding_window``, each query over that many keys up to its own."""
    block_size = k_cache.shape[2]
    for row in rows:
        end = row.start + row.length
        # The blocks before the one holding the first query's first visible key stay unread;
        # an even start keeps the table's 16-byte alignment (``plan_long_prefill``).
        first = max(0, row.prefix - sliding_window + 1) // block_size if sliding_window else 0
        first -= first % 2
        prefix = row.prefix - first * block_size
        k, v = gather_kv(
            k_cache, v_cache, row.blocks[first:], prefix + row.length, q.dtype, kv_scales
        )
        attend_row(out[row.start : end], q[row.start : end], k, v, prefix, scale, sliding_window)


def attend_row(
    out: Tensor, q: Tensor, k: Tensor, v: Tensor, prefix: int, scale: float, window: int = 0
) -> None:
    """One row: ``out, q [C, H, D]`` (the row's slices), ``k, v [Hkv, prefix + C, D]`` (views
    of token-major storage); a ``window`` only through FlashAttention-4 (``takes_long_path``)."""
    if flash_attn4_available(q.device):
        causal_attention(out, q, k.transpose(0, 1), v.transpose(0, 1), scale, window)
        return
    if window:
        raise ValueError(f"window: {window} needs FlashAttention-4, which {q.device} lacks")
    q_heads = q.transpose(0, 1)[None]  # [1, H, C, D], a view
    if prefix == 0:  # cuDNN's kernel takes the KV heads as they are (14-long-context.md)
        own = F.scaled_dot_product_attention(
            q_heads, k[None], v[None], is_causal=True, scale=scale, enable_gqa=True
        )
        out.copy_(own[0].transpose(0, 1))
        return
    own, own_lse = attention_with_lse(
        q_heads, k[None, :, prefix:], v[None, :, prefix:], True, scale
    )
    before, before_lse = attention_with_lse(
        q_heads, k[None, :, :prefix], v[None, :, :prefix], False, scale
    )
    merge_attention(
        out,
        own[0].transpose(0, 1),
        own_lse[0].transpose(0, 1),
        before[0].transpose(0, 1),
        before_lse[0].transpose(0, 1),
    )


def attention_with_lse(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """``q [1, H, Lq, D]`` over ``k, v [1, Hkv, Lk, D]`` (``Hkv`` dividing ``H``) → output
    ``[1, H, Lq, D]`` and natural-log log-sum-exps ``[1, H, Lq]`` (float32). ``causal``
    (queries as many as keys here) aligns the last query with the last key. cuDNN's kernel
    on a GPU that has it (FlashAttention-2's, at about half its rate, on others), both
    taking the KV heads as they are; the reference elsewhere."""
    if not q.is_cuda:
        return attention_with_lse_torch(q, k, v, causal, scale)
    aten = torch.ops.aten
    if _has_cudnn_attention(q.device):
        result = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False, scale=scale
        )
    else:
        result = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return result[0], result[1].view(q.shape[:3])


@functools.cache
def _has_cudnn_attention(device: torch.device) -> bool:
    """cuDNN's fused attention: enabled in torch, on Hopper or later (where it was measured)."""
    enabled = torch.backends.cudnn.is_available() and torch.backends.cuda.cudnn_sdp_enabled()
    return enabled and torch.cuda.get_device_capability(device) >= (9, 0)


def attention_with_lse_torch(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """``attention_with_lse`` in plain torch (float32 scores): the reference."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        queries, keys = scores.shape[-2:]
        visible = torch.ones(queries, keys, dtype=torch.bool, device=q.device)
        scores = scores.masked_fill(~visible.tril(keys - queries), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype), lse
