"""Long rows through the fused path (torch reference kernels on CPU) and the other rows
through the Triton kernels (interpreted), against the gather + SDPA reference."""

from __future__ import annotations

import math

import pytest
import torch

import infer.attention.long_prefill as long_prefill_module
from infer.attention import ScheduledSequence, build_metadata
from infer.attention.long_prefill import (
    attention_with_lse_torch,
    long_prefill_attention,
    takes_long_path,
    workspace_bytes,
)
from infer.attention.metadata import AttentionMetadata
from infer.attention.torch_backend import paged_attention_torch
from infer.attention.triton_backend import paged_attention_triton
from infer.kernels.paged_attention import TileConfig

BLOCK = 16
POISON = 100.0  # blocks no sequence owns: reading one shows up as a wrong output
SMALL_TILE = TileConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
LONG = 20  # rows with this many new tokens or more are long here


def make_step(
    specs: list[tuple[int, int]], heads: tuple[int, int] = (4, 2), head_dim: int = 32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Random q and caches for sequences ``[(context_len, new_tokens), ...]`` on shuffled
    blocks; the blocks no sequence owns are poisoned."""
    gen = torch.Generator().manual_seed(0)
    needed = [math.ceil(ctx / BLOCK) for ctx, _ in specs]
    num_blocks = sum(needed) + 3
    owned = torch.randperm(num_blocks, generator=gen).tolist()
    shape = (num_blocks, heads[1], BLOCK, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    for cache in (k_cache, v_cache):
        cache[owned[sum(needed) :]] = POISON
    seqs, used = [], 0
    for (ctx, new), n in zip(specs, needed, strict=True):
        seqs.append(ScheduledSequence(owned[used : used + n], ctx - new, [0] * new))
        used += n
    _, meta = build_metadata(seqs, BLOCK, torch.device("cpu"), long_rows_from=LONG)
    q = torch.randn(meta.positions.shape[0], heads[0], head_dim, generator=gen)
    return q, k_cache, v_cache, meta


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata):
    return paged_attention_torch(q, k, v, meta, q.shape[-1] ** -0.5)


def test_the_plan_takes_long_rows_out_of_the_triton_lists() -> None:
    # decode, long with a prefix, short prefill, long alone, decode
    specs = [(40, 1), (70, 30), (25, 5), (LONG, LONG), (9, 1)]
    _, _, _, meta = make_step(specs)
    plan = meta.long_prefill
    assert plan is not None and plan.rest is not None
    assert [(r.start, r.length, r.prefix) for r in plan.rows] == [(1, 30, 40), (36, 20, 0)]
    assert [r.blocks.tolist() for r in plan.rows] == [
        meta.block_tables[1, :5].tolist(),
        meta.block_tables[3, :2].tolist(),
    ]
    rest = plan.rest
    assert rest.row_counts.tolist() == [2, 1]
    assert rest.row_order.tolist()[:3] == [0, 4, 2]  # decode rows, then the short prefill
    owners = rest.token_rows.tolist()
    assert owners[1:31] == [-1] * 30 and owners[36:56] == [-1] * 20
    assert owners[31:36] == [2] * 5 and owners[0] == 0 and owners[56] == 4
    assert (rest.max_query_len, rest.max_seq_len) == (5, 40)
    assert meta.row_counts.tolist() == [2, 3]  # the step's own lists keep every row


def test_the_long_rows_block_tables_each_start_16_bytes_aligned() -> None:
    """Tables of odd lengths side by side in one copy: the gather kernel (specialised on its
    pointers' alignment) must meet the alignment its warm-up compiled for, row after row."""
    _, _, _, meta = make_step([(70, 30), (50, 50), (61, 23), (40, 40)])  # 5, 4, 4, 3 blocks
    assert meta.long_prefill is not None
    rows = meta.long_prefill.rows
    assert [len(row.blocks) for row in rows] == [5, 4, 4, 3]
    assert all(row.blocks.data_ptr() % 16 == 0 for row in rows)


def test_no_long_row_no_plan_and_a_step_of_long_rows_only_has_no_triton_view() -> None:
    assert make_step([(40, 1), (30, LONG - 1)])[3].long_prefill is None
    plan = make_step([(50, LONG), (LONG, LONG)])[3].long_prefill
    assert plan is not None and plan.rest is None and len(plan.rows) == 2


@pytest.mark.parametrize(
    "specs",
    [
        [(LONG, LONG)],  # a whole prompt
        [(61, 23)],  # a chunk after a prefix that ends mid-block
        [(40, 1), (96, 32), (25, 5), (50, 50), (9, 1)],  # beside decode rows and a short chunk
    ],
)
@pytest.mark.parametrize("heads", [(4, 2), (4, 1), (2, 2)])
def test_long_rows_and_triton_rows_together_match_the_reference(
    specs: list[tuple[int, int]], heads: tuple[int, int]
) -> None:
    q, k, v, meta = make_step(specs, heads)
    plan = meta.long_prefill
    assert plan is not None
    scale = q.shape[-1] ** -0.5
    if plan.rest is None:
        out = torch.full_like(q, float("nan"))
    else:
        out = paged_attention_triton(q, k, v, plan.rest, scale, prefill_tile=SMALL_TILE)
    long_prefill_attention(out, q, k, v, plan.rows, scale)
    torch.testing.assert_close(out, reference(q, k, v, meta), atol=1e-4, rtol=1e-4)


def test_the_triton_view_alone_leaves_long_rows_unwritten() -> None:
    """The Triton kernels read the rest view only: a long row's output is not theirs."""
    q, k, v, meta = make_step([(40, 1), (70, 30)])
    assert meta.long_prefill is not None and meta.long_prefill.rest is not None
    out = torch.full_like(q, 7.0)
    triton = paged_attention_triton(q, k, v, meta.long_prefill.rest, 32**-0.5)
    out[:1] = triton[:1]
    torch.testing.assert_close(out[:1], reference(q, k, v, meta)[:1], atol=1e-4, rtol=1e-4)


def test_attention_with_lse_aligns_the_causal_mask_to_the_last_key() -> None:
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    out, lse = attention_with_lse_torch(q, k, v, True, 0.5)
    scores = (q @ k.transpose(-1, -2)) * 0.5
    first = torch.softmax(scores[..., :1, :3], -1) @ v[..., :3, :]  # query 0 sees keys 0..2
    torch.testing.assert_close(out[..., :1, :], first)
    torch.testing.assert_close(lse[..., 2], torch.logsumexp(scores[..., 2, :], -1))


def test_the_fused_path_is_for_half_precision_and_windows_only_through_flash_attention_4(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    half = torch.zeros(1, dtype=torch.bfloat16)
    assert takes_long_path(half, 0)
    assert not takes_long_path(half, 512)  # cuDNN's path has no window: the Triton kernel
    assert not takes_long_path(torch.zeros(1), 0)
    monkeypatch.setattr(long_prefill_module, "flash_attn4_available", lambda device: True)
    assert takes_long_path(half, 512)


def test_workspace_bytes_counts_the_gathered_context_and_both_parts_outputs() -> None:
    assert workspace_bytes((24, 8, 128), 131072, 8192, 2) == 2 * 128 * (
        2 * 8 * 131072 + 2 * 24 * 8192
    )
