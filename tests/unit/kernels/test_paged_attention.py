"""Triton paged attention against the gather + SDPA reference (Triton interpreter on CPU).

``test_seed000_*`` are the 18 kernel cases of seed 000's testing plan and ``test_seed002_*``
the sliding-window cases of seed 002, both through the seeds' ``triton_paged_attention`` entry
point; the other tests drive ``paged_attention_triton`` with whole ragged batches.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tests.unit.kernels.h100_compile import assert_compiles_for_h100

import infer.kernels.paged_attention as paged_attention_module
from infer.attention.metadata import AttentionMetadata, ScheduledSequence, build_metadata
from infer.attention.torch_backend import paged_attention_torch
from infer.attention.triton_backend import paged_attention_triton
from infer.kernels.fp8 import to_fp8
from infer.kernels.paged_attention import (
    SHORT_PREFILL_LEN,
    SMALL_STEP_TOKENS,
    TileConfig,
    prefill_config,
    triton_paged_attention,
)

POISON = 100.0  # fills blocks no sequence owns: reading one shows up as a wrong output
SMALL_PREFILL = TileConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)


def make_batch(
    specs: list[tuple[int, int]],
    *,
    heads: tuple[int, int] = (4, 2),
    head_dim: int = 32,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Random q and caches for sequences ``specs = [(context_len, query_len), ...]``.

    Each sequence owns randomly chosen, non-contiguous blocks; block 0 and a few others are
    owned by nobody and poisoned.
    """
    num_heads, num_kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(ctx / block_size) for ctx, _ in specs]
    num_blocks = sum(needed) + 4
    owned = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    k_cache = torch.randn(shape, generator=gen)
    v_cache = torch.randn(shape, generator=gen)
    free = sorted(set(range(num_blocks)) - set(owned[: sum(needed)]))
    k_cache[free] = POISON
    v_cache[free] = POISON
    seqs, used = [], 0
    for (ctx, qlen), n in zip(specs, needed, strict=True):
        seqs.append(ScheduledSequence(owned[used : used + n], ctx - qlen, [0] * qlen))
        used += n
    _, meta = build_metadata(seqs, block_size, torch.device("cpu"))
    q = torch.randn(meta.positions.shape[0], num_heads, head_dim, generator=gen)
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), meta


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, window: int = 0
) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5
    return paged_attention_torch(q.float(), k.float(), v.float(), meta, scale, window)


def assert_matches(out: torch.Tensor, ref: torch.Tensor) -> None:
    tol = 1e-4 if out.dtype == torch.float32 else 3e-3
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def run_batch(specs: list[tuple[int, int]], window: int = 0, **kwargs) -> None:
    """Builds a batch, runs the kernels and the reference, compares them."""
    options = {
        k: kwargs.pop(k) for k in ("num_splits", "prefill_splits", "decode_tile") if k in kwargs
    }
    q, k, v, meta = make_batch(specs, **kwargs)
    tile = SMALL_PREFILL if kwargs.get("head_dim", 32) <= 64 else None
    out = paged_attention_triton(
        q, k, v, meta, q.shape[-1] ** -0.5, window, prefill_tile=tile, **options
    )
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_matches(out, reference(q, k, v, meta, window))


def seeds_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, window: int = 0
) -> torch.Tensor:
    """The seeds' entry point on one decode token per sequence: ``q [B, H, D]`` → ``[B, H, D]``."""
    out = triton_paged_attention(
        q[:, :, None], k, v, meta.block_tables, meta.seq_lens, scale=q.shape[-1] ** -0.5,
        max_num_blocks=meta.block_tables.shape[1], window_size=window,
    )  # fmt: skip
    assert out.shape == (*q.shape[:2], 1, q.shape[2])
    return out[:, :, 0]


def seeds_decode(
    lens: list[int], window: int = 0, **kwargs
) -> tuple[
    torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]
]:
    """A decode batch through the seeds' entry point; returns ``(out, reference, batch)``."""
    q, k, v, meta = make_batch([(n, 1) for n in lens], **kwargs)
    return seeds_call(q, k, v, meta, window), reference(q, k, v, meta, window), (q, k, v, meta)


# ---- seed 000: Triton paged attention kernel tests (18) ------------------------------------


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_seed000_matches_gather_sdpa(head_dim: int) -> None:
    out, ref, _ = seeds_decode([5, 40, 77], heads=(4, 4), head_dim=head_dim)
    assert_matches(out, ref)


def test_seed000_gqa_32q_heads_8kv_heads() -> None:
    out, ref, _ = seeds_decode([30, 64], heads=(32, 8))
    assert_matches(out, ref)


def test_seed000_gqa_head_mapping() -> None:
    """With V constant per KV head, query head i must return KV head i // 4's constant."""
    _, _, (q, k, v, meta) = seeds_decode([37], heads=(32, 8))
    v = torch.arange(8.0)[None, :, None, None].expand_as(v).contiguous()
    expected = (torch.arange(32) // 4).float()[None, :, None].expand(1, 32, 32)
    torch.testing.assert_close(seeds_call(q, k, v, meta), expected)


def test_seed000_variable_lengths_16_48_100_200() -> None:
    out, ref, _ = seeds_decode([16, 48, 100, 200], heads=(8, 2))
    assert_matches(out, ref)


def test_seed000_batched_equals_individual() -> None:
    lens = [16, 48, 100, 200]
    out, _, (q, k, v, meta) = seeds_decode(lens, heads=(8, 2))
    for b in range(len(lens)):
        _, alone = build_metadata(
            [ScheduledSequence(meta.block_tables[b].tolist(), int(meta.seq_lens[b]) - 1, [0])],
            16, torch.device("cpu"),
        )  # fmt: skip
        torch.testing.assert_close(seeds_call(q[b : b + 1], k, v, alone)[0], out[b])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seed000_randomized_page_mapping(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 120, (5,), generator=gen).tolist()
    out, ref, _ = seeds_decode(lens, heads=(4, 2), seed=seed)
    assert_matches(out, ref)


@pytest.mark.parametrize("length", [1, 7, 15])
def test_seed000_single_partial_block(length: int) -> None:
    out, ref, _ = seeds_decode([length], heads=(4, 2))
    assert_matches(out, ref)


@pytest.mark.parametrize("num_blocks", [1, 2, 5])
def test_seed000_block_aligned_length(num_blocks: int) -> None:
    out, ref, _ = seeds_decode([16 * num_blocks, 16 * num_blocks], heads=(4, 2))
    assert_matches(out, ref)


def test_seed000_mqa() -> None:
    out, ref, _ = seeds_decode([3, 50], heads=(8, 1))
    assert_matches(out, ref)


def test_seed000_float16() -> None:
    out, ref, _ = seeds_decode([20, 90], heads=(8, 2), dtype=torch.float16)
    assert_matches(out, ref)


# ---- seed 002: sliding window ---------------------------------------------------------------


def test_seed002_window0_is_full_attention() -> None:
    out, ref, (q, k, v, meta) = seeds_decode([45, 100], window=0)
    default = triton_paged_attention(
        q[:, :, None], k, v, meta.block_tables, meta.seq_lens, scale=q.shape[-1] ** -0.5,
        max_num_blocks=meta.block_tables.shape[1],
    )  # fmt: skip
    assert torch.equal(out, default[:, :, 0])  # the default is no window
    assert_matches(out, ref)


def test_seed002_window32_len100_sees_positions_68_to_99() -> None:
    out, _, (q, k, v, meta) = seeds_decode([100], window=32)
    # Explicit SDPA over the gathered sequence with a sliding-window mask.
    table = meta.block_tables[0]
    pos = torch.arange(100)
    keys = k[table[pos // 16].long(), :, pos % 16].transpose(0, 1)  # [Hkv, L, D]
    values = v[table[pos // 16].long(), :, pos % 16].transpose(0, 1)
    mask = (pos >= 68)[None, None, :]
    expected = F.scaled_dot_product_attention(
        q[0][:, None], keys.repeat_interleave(2, 0), values.repeat_interleave(2, 0),
        attn_mask=mask, scale=q.shape[-1] ** -0.5,
    )  # fmt: skip
    assert_matches(out[0], expected[:, 0])
    # Keys before position 68 do not contribute at all.
    k[table[pos[:68] // 16].long(), :, pos[:68] % 16] = 7.0
    v[table[pos[:68] // 16].long(), :, pos[:68] % 16] = 7.0
    assert torch.equal(seeds_call(q, k, v, meta, window=32), out)


@pytest.mark.parametrize("extra", [0, 50])
def test_seed002_window_at_least_seq_len_is_full_attention(extra: int) -> None:
    windowed, *_ = seeds_decode([60, 90], window=90 + extra)
    full, *_ = seeds_decode([60, 90], window=0)
    torch.testing.assert_close(windowed, full)


def test_seed002_window1_attends_current_position_only() -> None:
    out, ref, (_, _, v, meta) = seeds_decode([1, 33, 70], heads=(4, 2), window=1)
    last = meta.seq_lens.long() - 1
    table = meta.block_tables.long()
    blocks = table[torch.arange(3), last // 16]
    expected = v[blocks, :, last % 16].repeat_interleave(2, 1)  # [B, H, D]
    torch.testing.assert_close(out, expected)
    assert_matches(out, ref)


@pytest.mark.parametrize(
    ("length", "window"), [(96, 32), (100, 20), (111, 32)], ids=["block-start", "mid", "end"]
)
def test_seed002_window_boundary_alignment(length: int, window: int) -> None:
    """Window start ``length - window`` at a block start, mid-block, a block's last slot."""
    out, ref, _ = seeds_decode([length], window=window)
    assert_matches(out, ref)


def test_seed002_blocks_outside_window_are_not_read() -> None:
    _, ref, (q, k, v, meta) = seeds_decode([200], window=40)
    table = meta.block_tables[0].long()
    first_visible_block = (200 - 40) // 16
    k[table[:first_visible_block]] = float("nan")
    v[table[:first_visible_block]] = float("nan")
    assert_matches(seeds_call(q, k, v, meta, window=40), ref)


# ---- ragged batches through paged_attention_triton -----------------------------------------


@pytest.mark.parametrize("block_size", [8, 16, 24])
def test_decode_lengths_around_block_boundaries(block_size: int) -> None:
    bs = block_size
    lens = [1, bs - 1, bs, bs + 1, 3 * bs + 5]
    run_batch([(n, 1) for n in lens], block_size=block_size, heads=(4, 2))


@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (16, 2), (8, 1)], ids=["mha", "g4", "g8", "mqa"])
def test_gqa_ratios_mixed_batch(heads: tuple[int, int]) -> None:
    run_batch([(40, 40), (70, 1), (33, 9)], heads=heads)


@pytest.mark.parametrize("window", [1, 32, 200])
def test_sliding_window_mixed_batch(window: int) -> None:
    """Decode rows, a whole prefill, a chunk and a cached-prefix prefill with a window."""
    run_batch([(90, 1), (50, 50), (120, 24), (70, 3)], window=window, heads=(4, 2))


def test_mixed_prefill_chunks_prefix_and_decode() -> None:
    specs = [(1, 1), (17, 1), (64, 64), (100, 36), (130, 2), (47, 46), (16, 16)]
    run_batch(specs, heads=(6, 2))


@pytest.mark.parametrize("window", [0, 40])
def test_prefix_cached_prefill_default_tiles(window: int) -> None:
    """Queries shorter than the context; default (128-row) prefill tiles."""
    specs = [(150, 20), (96, 96), (64, 15)]
    run_batch(specs, window, heads=(8, 2), head_dim=128, dtype=torch.float16)


def test_prefill_tile_follows_the_longest_sequence() -> None:
    """head_dim 128 batches get the narrow tile up to SHORT_PREFILL_LEN tokens, the wide one
    past it (and the wide tile is right: a chunk over a context longer than that)."""
    assert prefill_config(128, SHORT_PREFILL_LEN) != prefill_config(128, SHORT_PREFILL_LEN + 1)
    run_batch(
        [(SHORT_PREFILL_LEN + 40, 24), (30, 1)],
        heads=(2, 1), head_dim=128, dtype=torch.float16,
    )  # fmt: skip


def test_a_small_step_gets_the_narrow_tile_and_is_right() -> None:
    """A cached prefix's few new tokens beside a decode row: 64-row tiles, keys in pieces."""
    assert prefill_config(128, 8192, 2, SMALL_STEP_TOKENS) == TileConfig(64, 64, 4, 2)
    assert prefill_config(128, 8192, 2, SMALL_STEP_TOKENS + 1) != TileConfig(64, 64, 4, 2)
    run_batch(
        [(150, 9), (60, 1)], heads=(6, 2), head_dim=128, dtype=torch.float16, prefill_splits=3
    )


@pytest.mark.parametrize("num_splits", [2, 3, 7])
@pytest.mark.parametrize("window", [0, 45])
def test_split_kv_decode(num_splits: int, window: int) -> None:
    run_batch([(1, 1), (30, 1), (200, 1), (64, 1)], window=window, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [3, 7], ids=["merged-in-kernel", "combine-kernel"])
def test_split_kv_decode_reuses_its_scratch_across_calls(num_splits: int) -> None:
    """Layers of a step share the split scratch: every call leaves the finished-split
    counters at zero for the next one (the merging split resets its counter)."""
    q, k, v, meta = make_batch([(130, 1), (70, 1), (9, 1)], heads=(4, 2))
    for layer in range(3):
        q_layer = q + layer
        out = paged_attention_triton(q_layer, k, v, meta, 32**-0.5, num_splits=num_splits)
        assert_matches(out, reference(q_layer, k, v, meta))
    scratch = [v for key, v in meta.derived.items() if key.startswith("paged_attention_splits")]
    assert len(scratch) == 1 and scratch[0][-1].count_nonzero() == 0


# Three cases of the six (windows 0 and 37 x 2, 5 and 9 splits), each kernel path still run
# (the same lines of the kernels run as with all six): 2 splits, unwindowed: a power-of-two
# split count (the merge masks no slot) and pieces of several key steps, as many pieces as
# splits; 9 splits, unwindowed: pieces clamped to two key steps, so the 200-key row has 7
# pieces and splits 7 and 8 exit with no key; 5 splits, window 37: the window's masked key
# steps, at most 41 keys a tile (two pieces of two steps, three idle splits), a split count
# the merge pads to 8. Every case has tiles cut in pieces and tiles of one piece.
@pytest.mark.parametrize(("window", "prefill_splits"), [(0, 2), (0, 9), (37, 5)])
def test_split_kv_prefill(prefill_splits: int, window: int) -> None:
    """Prefill tiles whose keys are cut into pieces, merged by the last piece to finish: a
    cached prefix's few new tokens, a chunk over a longer context, a whole prompt, and pieces
    that get no key at all (more pieces than key steps)."""
    specs = [(200, 5), (150, 40), (33, 33), (90, 1), (20, 3)]
    run_batch(specs, window, heads=(6, 2), prefill_splits=prefill_splits)


def test_split_kv_prefill_reuses_its_scratch_across_calls() -> None:
    """Layers of a step share the split partials; each call overwrites every piece it reads
    (the second layer's call reads where the first one's partials are)."""
    q, k, v, meta = make_batch([(130, 9), (70, 1), (40, 20)], heads=(4, 2))
    for layer in range(2):
        q_layer = q + layer
        out = paged_attention_triton(
            q_layer, k, v, meta, 32**-0.5, prefill_tile=SMALL_PREFILL, prefill_splits=4
        )
        assert_matches(out, reference(q_layer, k, v, meta))
    scratch = [v for key, v in meta.derived.items() if key.startswith("paged_attention_splits")]
    assert len(scratch) == 1


def test_split_kv_decode_rows_in_mixed_batch() -> None:
    run_batch([(150, 1), (60, 60), (99, 1)], num_splits=4, heads=(8, 2))


@pytest.mark.parametrize("block_n", [16, 32])
def test_decode_tile_widths(block_n: int) -> None:
    tile = TileConfig(block_m=16, block_n=block_n, num_warps=4, num_stages=1)
    run_batch([(33, 1), (100, 1)], decode_tile=tile, heads=(4, 2))


def test_float16_mixed_batch() -> None:
    run_batch([(80, 1), (40, 40), (55, 7)], heads=(4, 2), dtype=torch.float16)


def test_strided_query_view() -> None:
    """q may be a view into a fused qkv projection output."""
    q, k, v, meta = make_batch([(40, 40), (9, 1)], heads=(4, 2))
    qkv = torch.cat([q.flatten(1), torch.randn(q.shape[0], 2 * 2 * 32)], dim=1)
    q_view = qkv[:, : 4 * 32].view(-1, 4, 32)
    assert not q_view.is_contiguous()
    out = paged_attention_triton(q_view, k, v, meta, 32**-0.5, prefill_tile=SMALL_PREFILL)
    assert_matches(out, reference(q, k, v, meta))


def test_rejects_unsupported_head_dim() -> None:
    q, k, v, meta = make_batch([(5, 1)], head_dim=24)
    with pytest.raises(ValueError, match="head_dim"):
        paged_attention_triton(q, k, v, meta, 0.2)


def _padded_to_bucket(meta: AttentionMetadata, rows: int, tokens: int) -> AttentionMetadata:
    """``meta`` as a CUDA graph's bucket holds it: rows without tokens, tokens in no row,
    and the bucket's bounds for the host-side lengths."""
    extra_rows = rows - meta.num_seqs
    extra_tokens = tokens - meta.positions.shape[0]

    def pad(x: torch.Tensor, count: int, value: int = 0) -> torch.Tensor:
        return torch.cat([x, x.new_full((count, *x.shape[1:]), value)])

    return AttentionMetadata(
        block_tables=pad(meta.block_tables, extra_rows),
        seq_lens=pad(meta.seq_lens, extra_rows),
        query_start_loc=pad(meta.query_start_loc, extra_rows, int(meta.query_start_loc[-1])),
        max_query_len=tokens,
        max_seq_len=4 * meta.max_seq_len,
        positions=pad(meta.positions, extra_tokens),
        slot_mapping=pad(meta.slot_mapping, extra_tokens, -1),
        row_order=torch.cat([meta.row_order, torch.arange(meta.num_seqs, rows).int()]),
        row_counts=meta.row_counts,
        token_rows=pad(meta.token_rows, extra_tokens, -1),
    )


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [0, 40])
def test_a_step_padded_to_a_graph_bucket_changes_no_real_row(num_splits: int, window: int) -> None:
    """Padding rows exit at once and padding tokens are no row's: the real rows match the
    unpadded reference, and the reference gives the padding tokens zeros."""
    q, k, v, meta = make_batch([(90, 1), (50, 50), (120, 24), (70, 1)], heads=(4, 2))
    real = q.shape[0]
    padded = _padded_to_bucket(meta, rows=8, tokens=real + 13)
    q_padded = torch.cat([q, torch.randn(13, *q.shape[1:])])
    out = paged_attention_triton(
        q_padded, k, v, padded, 32**-0.5, window, prefill_tile=SMALL_PREFILL,
        num_splits=num_splits, prefill_splits=num_splits,
    )  # fmt: skip
    expected = reference(q, k, v, meta, window)
    assert_matches(out[:real], expected)
    padded_reference = reference(q_padded, k, v, padded, window)
    assert_matches(padded_reference[:real], expected)
    assert padded_reference[real:].count_nonzero() == 0


@pytest.mark.parametrize("prefill_splits", [1, 3])
def test_every_row_a_two_token_prefill_fills_the_tile_grid_exactly(prefill_splits: int) -> None:
    """The most prefill rows a step can hold (two tokens each) with padding rows beside them:
    the grid, sized from the bucket's tokens and rows alone, has a program for every tile."""
    q, k, v, meta = make_batch([(17 + 9 * i, 2) for i in range(10)], heads=(4, 2))
    padded = _padded_to_bucket(meta, rows=16, tokens=q.shape[0])
    out = paged_attention_triton(
        q, k, v, padded, 32**-0.5, prefill_tile=SMALL_PREFILL, prefill_splits=prefill_splits
    )
    assert_matches(out, reference(q, k, v, meta))


@pytest.mark.parametrize("grid_splits", [3, 7], ids=["merged-in-kernel", "combine-kernel"])
def test_decode_rows_split_by_the_rows_the_step_holds(
    grid_splits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph's grid is split for its fewest decode rows; a step with more splits each row
    less (here 6 programs over 3 decode rows: 2 pieces), and the merge reads only those."""
    monkeypatch.setattr(paged_attention_module, "num_kv_splits", lambda *args: grid_splits)
    monkeypatch.setattr(paged_attention_module, "_split_programs", lambda *args: 6)
    q, k, v, meta = make_batch([(130, 1), (64, 30), (70, 1), (9, 1)], heads=(4, 2))
    padded = _padded_to_bucket(meta, rows=8, tokens=q.shape[0] + 3)
    q_padded = torch.cat([q, torch.randn(3, *q.shape[1:])])
    out = paged_attention_triton(q_padded, k, v, padded, 32**-0.5, prefill_tile=SMALL_PREFILL)
    assert_matches(out[: q.shape[0]], reference(q, k, v, meta))


def _verify_batch(
    specs: list[tuple[int, int]], queries: int, **kwargs
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A step verifying proposals: every row has 1 to ``queries`` new tokens."""
    q, k, v, meta = make_batch(specs, **kwargs)
    meta.decode_queries = queries
    return q, k, v, meta


@pytest.mark.parametrize("num_splits", [1, 3, 7], ids=["one", "merged-in-kernel", "combine"])
@pytest.mark.parametrize("window", [0, 3, 40])
def test_decode_rows_with_several_queries_are_causal_among_them(
    num_splits: int, window: int
) -> None:
    """Rows verifying proposals (up to five new tokens, some fewer, one plain) match the
    reference, which masks each token's later neighbours and window."""
    specs = [(130, 5), (9, 2), (64, 1), (70, 5), (17, 4)]
    q, k, v, meta = _verify_batch(specs, queries=5, heads=(6, 2))
    out = paged_attention_triton(q, k, v, meta, 32**-0.5, window, num_splits=num_splits)
    assert_matches(out, reference(q, k, v, meta, window))


@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1)], ids=["mha", "g4", "mqa"])
def test_several_query_decode_rows_fill_the_tile_for_every_group(heads: tuple[int, int]) -> None:
    queries = 3 if heads[0] // heads[1] == 8 else 5
    q, k, v, meta = _verify_batch([(50, queries), (33, 2)], queries=queries, heads=heads)
    out = paged_attention_triton(q, k, v, meta, 32**-0.5, num_splits=3)
    assert_matches(out, reference(q, k, v, meta))


def test_several_query_decode_rows_in_float16() -> None:
    q, k, v, meta = _verify_batch([(90, 4), (40, 3)], queries=4, dtype=torch.float16)
    assert_matches(paged_attention_triton(q, k, v, meta, 32**-0.5), reference(q, k, v, meta))


def test_several_query_rows_padded_to_a_bucket_change_no_real_row() -> None:
    """A verify graph's padding: rows without tokens and tokens in no row."""
    q, k, v, meta = _verify_batch([(90, 5), (30, 3)], queries=5, heads=(4, 2))
    real = q.shape[0]
    padded = _padded_to_bucket(meta, rows=4, tokens=20)
    padded.max_query_len, padded.decode_queries = 5, 5
    q_padded = torch.cat([q, torch.randn(20 - real, *q.shape[1:])])
    out = paged_attention_triton(q_padded, k, v, padded, 32**-0.5, num_splits=7)
    assert_matches(out[:real], reference(q, k, v, meta))


def test_decode_queries_bounds_are_checked() -> None:
    q, k, v, meta = _verify_batch([(40, 5)], queries=4)
    with pytest.raises(ValueError, match="5 query tokens"):
        paged_attention_triton(q, k, v, meta, 0.2)
    meta.decode_queries = 64
    with pytest.raises(ValueError, match="decode_queries must be"):
        paged_attention_triton(q, k, v, meta, 0.2)


# ---- an FP8 (e4m3) cache: widened as loaded, scaled per tensor --------------------------------

FP8_SCALES = (0.02, 0.03)  # K and V: the random caches (and the poison) span e4m3's range


@pytest.mark.parametrize(
    ("specs", "window", "options", "dtype"),
    [
        ([(90, 1), (50, 50), (120, 24), (70, 3)], 0, {}, torch.float16),  # decode, prompt,
        ([(90, 1), (50, 50), (120, 24), (70, 3)], 32, {}, torch.float32),  # chunk, prefix
        ([(1, 1), (200, 1), (64, 1)], 0, {"num_splits": 3}, torch.float16),
        ([(150, 9), (60, 1)], 0, {"prefill_splits": 3}, torch.float32),
    ],
    ids=["mixed", "window", "split-decode", "split-prefill"],
)
def test_an_fp8_cache_is_read_as_its_values_times_the_scales(
    specs: list[tuple[int, int]], window: int, options: dict[str, int], dtype: torch.dtype
) -> None:
    q, k, v, meta = make_batch(specs, heads=(4, 2), dtype=dtype)
    k_fp8, v_fp8 = to_fp8(k, FP8_SCALES[0]), to_fp8(v, FP8_SCALES[1])
    scale = q.shape[-1] ** -0.5
    out = paged_attention_triton(
        q, k_fp8, v_fp8, meta, scale, window, kv_scales=FP8_SCALES, prefill_tile=SMALL_PREFILL,
        **options,
    )  # fmt: skip
    expected = paged_attention_torch(q.float(), k_fp8, v_fp8, meta, scale, window, FP8_SCALES)
    assert out.dtype == dtype
    assert_matches(out, expected)
    # Unscaled, the same cache reads as other values: the scales are applied, not ignored.
    unscaled = paged_attention_triton(
        q, k_fp8, v_fp8, meta, scale, window, prefill_tile=SMALL_PREFILL, **options
    )
    assert not torch.allclose(unscaled.float(), expected, atol=1e-2)


@pytest.mark.parametrize("num_splits", [1, 3, 7], ids=["one", "merged-in-kernel", "combine"])
def test_several_query_decode_rows_read_an_fp8_cache(num_splits: int) -> None:
    """Verify rows over an FP8 cache: the scales reach the split partials and their merge."""
    q, k, v, meta = _verify_batch(
        [(130, 5), (9, 2), (64, 1)], queries=5, heads=(6, 2), dtype=torch.float16
    )
    k_fp8, v_fp8 = to_fp8(k, FP8_SCALES[0]), to_fp8(v, FP8_SCALES[1])
    scale = q.shape[-1] ** -0.5
    out = paged_attention_triton(
        q, k_fp8, v_fp8, meta, scale, num_splits=num_splits, kv_scales=FP8_SCALES
    )
    expected = paged_attention_torch(q.float(), k_fp8, v_fp8, meta, scale, 0, FP8_SCALES)
    assert_matches(out, expected)


_COMPILE = """
from infer.kernels import paged_attention as kernels

rows = {n: "*i32" for n in ("Tables", "SeqLens", "QueryStart", "RowOrder", "RowCounts")}
floats = {"Out": "*bf16", "PartOut": "*fp32", "PartLse": "*fp32"}
compile_for_h100(
    kernels._decode_kernel,
    {**rows, **floats, "Q": "*bf16", "K": "*fp8e4nv", "V": "*fp8e4nv", "Counters": "*i32",
     "qk_scale": "fp32", "v_scale": "fp32"},
    {"GROUP": 3, "ROWS": 16, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "BLOCK_N": 64, "SPLIT": True,
     "DOT_PRECISION": "tf32", "DECODE_ONLY": True, "QUERIES": 5, "PDL": True},
)
compile_for_h100(
    kernels._combine_kernel,
    {**rows, **floats, "TokenRows": "*i32"},
    {"SPLITS_POW2": 8, "HEAD_DIM": 128, "PREFILL": False, "DECODE_ONLY": True, "BLOCK_Q": 16,
     "BLOCK_N": 64, "QUERIES": 5, "PDL": True},
)
"""


def test_verify_rows_over_an_fp8_cache_compile_for_a_gpu() -> None:
    """The interpreter runs what Triton's compiler may reject: the decode and combine kernels
    with several queries a row over an e4m3 cache compile for an H100 (no GPU needed; in a
    process of its own, since the tests' kernels are the interpreter's)."""
    assert_compiles_for_h100(_COMPILE)
