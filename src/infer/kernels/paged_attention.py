"""Triton paged attention over the flat ragged batch: decode rows, prefills, chunks, prefixes.

Both kernels run one inner loop, ``_attend_range``: online softmax (base 2, fp32) over keys
gathered token by token through the block table, so any block size works and a sliding window
starts reading at its first visible key. The query heads that share a KV head are rows of one
``tl.dot`` tile, so each K/V tile is loaded once for all of them.

* ``_decode_kernel`` serves sequences with one query row, or, in a step that says so
  (``decode_queries``: speculative proposals being verified), a few rows causal among
  themselves: their query heads are rows of the same tile, so checking proposals reads the
  keys once, as a plain decode row does. One program per (sequence, KV head, split); with
  few sequences and long contexts the keys are split (flash-decoding). With a
  few splits the last one of a (sequence, KV head) to finish merges the partial results (a
  counter per pair says which is last); with many, ``_combine_kernel`` merges them, one
  program per head, since one program merging dozens of splits in turn is slower.
* ``_prefill_kernel`` serves sequences with more query rows (prefill, chunk, cached prefix):
  FlashAttention-2 causal tiles whose rows are (token, head) pairs; key tiles visible to every
  row skip the masks. When a step has few tiles (a cached prefix's new tokens, a short last
  chunk) their keys are split too, and ``_combine_kernel`` merges each token's pieces.

The launches depend only on shapes and python ints and every loop bound is read on the device
(``seq_lens``, ``query_start_loc``), so a step can be captured in a CUDA graph and replayed
with new lengths. A graph's grid is sized for its bucket; the host lists the batch's rows by
kind (``row_order``, ``row_counts``, ``token_rows``), so each program finds its row with a
read or two, the real work is launched first, and spare programs exit at once
(``benchmarks/results-by-topic/06-prefill-caching.md``, 6.1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.pdl import pdl_launch, wait_for_previous_kernel
from infer.kernels.ragged_batch import RaggedBatch

# (partials shape, counters shape) → split partials, log-sum-exps and finished-split counters.
SplitScratch = Callable[[tuple[int, ...], tuple[int, int]], tuple[Tensor, Tensor, Tensor]]

_LOG2E = 1.4426950408889634
_MAX_SPLITS = 32
_MIN_KEYS_PER_SPLIT = 256
_MAX_SPLITS_MERGED_IN_KERNEL = 4  # more splits merge in their own kernel (07-kernels.md, 7.3)
_MAX_DECODE_TILE_ROWS = 64  # (token, head) rows of a decode program verifying proposals
SHORT_PREFILL_LEN = 1024  # batches with no longer sequence get the narrow prefill tile
SMALL_STEP_TOKENS = 256  # steps with no more tokens split their prefill tiles' keys


@dataclass(frozen=True)
class TileConfig:
    """Launch shape of a kernel.

    ``block_m``: query rows per program (decode: at least this many, padded query heads).
    ``block_n``: keys per inner step. ``num_warps``/``num_stages``: Triton launch options.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def decode_config(head_dim: int) -> TileConfig:
    """Default decode tile: one token's query heads padded to 16 rows, wide key steps.

    Chosen with ``benchmarks/bench_kernels.py --sweep`` on an H200 (Llama-3.2-3B heads).
    """
    return TileConfig(16, 32 if head_dim > 128 else 64, 4, 3)


def prefill_config(
    head_dim: int, max_seq_len: int = 4096, element_size: int = 2, num_tokens: int = 4096
) -> TileConfig:
    """Default prefill tile for a batch whose longest sequence has ``max_seq_len`` tokens.

    Chosen like ``decode_config``, on an H100 for head_dim 128 (``benchmarks/results-by-topic/
    07-kernels.md``, 7.3): wide key
    steps pay off over long contexts, short ones finish sooner with narrow steps and fewer
    warps. Float32 (``element_size`` 4, the GPU tests' reference dtype) takes half the rows
    and one stage: 128 rows of 256-wide float32 heads overflow an H200's shared memory.

    A step of at most ``SMALL_STEP_TOKENS`` tokens (a cached prefix's new tokens beside decode
    rows) gets 64-row tiles, its keys split (``num_prefill_splits``): faster up to that bound,
    not past it (``bench_kernels.py --mixed``, ``benchmarks/results-by-topic/
    06-prefill-caching.md``, 6.2).
    """
    if element_size > 2:
        return TileConfig(64, 32, 4, 1)
    if head_dim <= 128 and num_tokens <= SMALL_STEP_TOKENS:
        return TileConfig(64, 64, 4, 2)
    if head_dim > 128:
        return TileConfig(128, 64, 8, 2)
    if head_dim == 128:
        short = max_seq_len <= SHORT_PREFILL_LEN
        return TileConfig(128, 32, 4, 3) if short else TileConfig(128, 128, 8, 2)
    return TileConfig(128, 64, 8, 3)


# fmt: off
@triton.jit
def _attend_range(
    acc, m_i, l_i, q, q_pos, win_lo,
    K, V, table, stride_kb, stride_kt, stride_vb, stride_vt,
    start, end, kv_end, qk_scale,
    BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Folds keys ``[start, end)`` into the running softmax state ``(acc, m_i, l_i)``.

    ``MASKED`` applies the key range (``< kv_end``), causal (``<= q_pos``) and window
    (``>= win_lo``) masks; unmasked calls must cover keys visible to every row.
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for k0 in range(start, end, BLOCK_N):
        kpos = k0 + offs_n
        in_range = kpos < kv_end
        entry = table + kpos // BLOCK_SIZE
        block = (tl.load(entry, mask=in_range, other=0) if MASKED else tl.load(entry)).to(tl.int64)
        slot = kpos % BLOCK_SIZE
        k_ptrs = K + (block * stride_kb + slot * stride_kt)[:, None] + offs_d[None, :]
        k = tl.load(k_ptrs, mask=in_range[:, None], other=0.0) if MASKED else tl.load(k_ptrs)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)
        if MASKED:
            visible = (in_range[None, :] & (kpos[None, :] <= q_pos[:, None])
                       & (kpos[None, :] >= win_lo[:, None]))
            s = tl.where(visible, s, float("-inf"))
        # Scaled scores are s * qk_scale (base 2); the scale is folded into the max and exp2.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        # Rows that have seen no visible key yet keep m = -inf: shift them by 0, not by -inf.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new) if MASKED else m_new
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s * qk_scale - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = V + (block * stride_vb + slot * stride_vt)[:, None] + offs_d[None, :]
        v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0) if MASKED else tl.load(v_ptrs)
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _merge_splits(part, part_lse, rows_ok, num_splits, stride_ps, stride_ls,
                  ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The rows' outputs from their splits' partial outputs and log-sum-exps (base 2), each
    split weighted by its share of the softmax mass."""
    merged = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    top = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    total = tl.zeros([ROWS], dtype=tl.float32)
    for i in range(num_splits):
        lse_i = tl.load(part_lse + i * stride_ls, mask=rows_ok, other=float("-inf"))
        top_new = tl.maximum(top, lse_i)
        shift = tl.where(top_new == float("-inf"), 0.0, top_new)
        keep, weight = tl.exp2(top - shift), tl.exp2(lse_i - shift)
        part_i = tl.load(part + i * stride_ps, mask=rows_ok[:, None], other=0.0)
        merged = merged * keep[:, None] + part_i * weight[:, None]
        total = total * keep + weight
        top = top_new
    return merged / tl.where(total > 0, total, 1.0)[:, None]


@triton.jit
def _decode_splits(num_splits, row_splits, num_decode):
    """The pieces each decode row's keys are cut into: ``row_splits`` programs (per KV head)
    shared by the step's decode rows, at most the grid's ``num_splits`` (sized for the most
    rows the step may hold, so a mixed step's few decode rows are split further)."""
    return tl.maximum(tl.minimum(num_splits, tl.cdiv(row_splits, num_decode)), 1)


# Triton compiles a variant per integer argument that is 1 or a multiple of 16: arguments
# that change with a step's shape (the block table's width, the split partials' strides)
# would each compile at first use, mid-serving (seen on the first chat burst). Not
# specialised, one variant serves every step and the warm-up compiles it.
_SPLIT_STRIDES = ["stride_pb", "stride_ps", "stride_ph", "stride_lb", "stride_ls"]


@triton.jit(do_not_specialize=[
    "window", "num_splits", "row_splits", "merge", "stride_table", *_SPLIT_STRIDES])
def _decode_kernel(
    Out, Q, K, V, Tables, SeqLens, QueryStart, RowOrder, RowCounts, PartOut, PartLse, Counters,
    stride_ot, stride_oh, stride_qt, stride_qh,
    stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_table,
    stride_pb, stride_ps, stride_ph, stride_lb, stride_ls,
    qk_scale, v_scale, window, num_splits, row_splits, merge,
    GROUP: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DECODE_ONLY: tl.constexpr, QUERIES: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2)
    q_len = 1
    if DECODE_ONLY:  # row ``seq`` has 1 to QUERIES query tokens, or is padding
        row = tl.load(QueryStart + seq)
        q_len = tl.load(QueryStart + seq + 1) - row
        if (q_len < 1) | (q_len > QUERIES):
            return
    else:
        num_decode = tl.load(RowCounts)
        index = seq
        seq = tl.load(RowOrder + index)  # (read beside the count: the grid has a row each)
        if index >= num_decode:
            return  # the batch has fewer decode rows than the grid
        num_splits = _decode_splits(num_splits, row_splits, num_decode)
        if split >= num_splits:
            return
        row = tl.load(QueryStart + seq)
    seq_len = tl.load(SeqLens + seq)
    # The keys some query row sees (the first row's window starts earliest).
    lo = tl.where(window > 0, tl.maximum(seq_len - q_len + 1 - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    # Rows are (token, head) pairs: the QUERIES tokens x the GROUP query heads of this KV head.
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    tok = offs_r // GROUP
    heads = kv_head * GROUP + offs_r % GROUP
    rows_ok = (offs_r < QUERIES * GROUP) & (tok < q_len)
    q_ptrs = Q + (row + tok)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=rows_ok[:, None], other=0.0)
    q_pos = seq_len - q_len + tok
    win_lo = tl.where(window > 0, tl.maximum(q_pos - window + 1, 0), 0)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc, m_i, l_i = _attend_range(
        acc, m_i, l_i, q, q_pos, win_lo,
        K + kv_head * stride_kh, V + kv_head * stride_vh, Tables + seq * stride_table,
        stride_kb, stride_kt, stride_vb, stride_vt, start, end, end, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, True, DOT_PRECISION,
    )
    has_keys = l_i > 0
    out = acc * (v_scale / tl.where(has_keys, l_i, 1.0))[:, None]
    o_ptrs = Out + (row + tok)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    if not SPLIT:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=rows_ok[:, None])
        return
    # Partials hold a sequence's query heads token after token.
    slot = tok * (GROUP * tl.num_programs(0)) + heads
    part = PartOut + seq * stride_pb + slot[:, None] * stride_ph + offs_d[None, :]
    tl.store(part + split * stride_ps, out, mask=rows_ok[:, None])
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    part_lse = PartLse + seq * stride_lb + slot
    tl.store(part_lse + split * stride_ls, lse, mask=rows_ok)
    if merge != 0:  # a run-time flag: the warmed-up split variant serves both ways
        # The last split of this (sequence, KV head) to finish merges them all. Its acquire
        # sees every other split's stores (each released them with its increment).
        tl.debug_barrier()
        counter = Counters + seq * tl.num_programs(0) + kv_head
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            tl.store(counter, 0)  # ready for the next call (and the next graph replay)
            merged = _merge_splits(part, part_lse, rows_ok, num_splits, stride_ps, stride_ls,
                                   ROWS, HEAD_DIM)
            tl.store(o_ptrs, merged.to(Out.dtype.element_ty), mask=rows_ok[:, None])


@triton.jit(do_not_specialize=["window", "num_splits", "row_splits", *_SPLIT_STRIDES])
def _combine_kernel(
    Out, PartOut, PartLse, QueryStart, SeqLens, RowOrder, RowCounts, TokenRows, window,
    stride_ot, stride_oh, stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, num_splits,
    row_splits, SPLITS_POW2: tl.constexpr, HEAD_DIM: tl.constexpr, PREFILL: tl.constexpr,
    DECODE_ONLY: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    QUERIES: tl.constexpr, PDL: tl.constexpr,
):
    """Merges a row's splits, weighting each by its share of the softmax mass: decode rows
    (partials by sequence, ``QUERIES`` tokens' heads each) or, with ``PREFILL``, prefill
    tokens (partials by token) of tiles cut into more than one piece."""
    wait_for_previous_kernel(PDL)
    slot = tl.program_id(0)  # (token, head) of a decode sequence's partials; else the head
    index = tl.program_id(1)
    head = slot % (tl.num_programs(0) // QUERIES)
    tok = slot // (tl.num_programs(0) // QUERIES)
    if PREFILL:
        seq = tl.load(TokenRows + index)
        if seq < 0:
            return  # a padding token
        q_start = tl.load(QueryStart + seq)
        q_len = tl.load(QueryStart + seq + 1) - q_start
        if q_len <= 1:
            return  # a decode row's token
        _, _, _, _, _, pieces = _tile_keys(tl.load(SeqLens + seq), q_len,
                                           (index - q_start) // BLOCK_Q, window, num_splits,
                                           BLOCK_Q, BLOCK_N)
        if pieces == 1:
            return  # the prefill kernel wrote it
        row = index
    elif DECODE_ONLY:
        row = tl.load(QueryStart + index)
        q_len = tl.load(QueryStart + index + 1) - row
        if (q_len < 1) | (q_len > QUERIES) | (tok >= q_len):
            return  # padding
        row += tok
        pieces = num_splits
    else:
        num_decode = tl.load(RowCounts)
        seq = tl.load(RowOrder + index)
        if index >= num_decode:
            return  # the batch has fewer decode rows than the grid
        index = seq
        row = tl.load(QueryStart + index)
        pieces = _decode_splits(num_splits, row_splits, num_decode)
    offs_s = tl.arange(0, SPLITS_POW2)
    offs_d = tl.arange(0, HEAD_DIM)
    split_ok = offs_s < pieces
    lse = tl.load(PartLse + index * stride_lb + offs_s * stride_ls + slot, mask=split_ok,
                  other=float("-inf"))
    m = tl.max(lse, 0)
    weight = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))
    total = tl.sum(weight, 0)
    part_ptrs = (PartOut + index * stride_pb + offs_s[:, None] * stride_ps + slot * stride_ph
                 + offs_d[None, :])
    parts = tl.load(part_ptrs, mask=split_ok[:, None], other=0.0)
    out = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(Out + row * stride_ot + head * stride_oh + offs_d, out.to(Out.dtype.element_ty))


@triton.jit
def _tile_keys(seq_len, q_len, tile, window, num_splits, BLOCK_Q: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """A prefill tile's tokens ``[first, last]`` and the keys some row sees, ``[lo, kv_end)``;
    split in ``num_splits``, pieces of ``share`` keys (whole key steps, at least two), the
    first ``pieces`` of which hold keys."""
    first = seq_len - q_len + tile * BLOCK_Q
    last = tl.minimum(first + BLOCK_Q, seq_len) - 1
    lo = tl.where(window > 0, tl.maximum(first - window + 1, 0), 0)
    kv_end = last + 1
    share = tl.maximum(tl.cdiv(tl.cdiv(kv_end - lo, num_splits), BLOCK_N), 2) * BLOCK_N
    return first, last, lo, kv_end, share, tl.cdiv(kv_end - lo, share)


@triton.jit
def _find_prefill_row(QueryStart, Prefill, num_prefill, pid, BLOCK_Q: tl.constexpr):
    """Binary search for the last prefill row ``k`` (of ``Prefill``, the rows with several
    tokens in batch order) with ``query_start[row_k] // BLOCK_Q + k <= pid``.

    Row ``k``'s tiles are numbered from ``query_start[row_k] // BLOCK_Q + k``: it needs at
    most ``cdiv(qlen_k, BLOCK_Q)`` numbers and gets ``qlen_k // BLOCK_Q + 1`` or more, so
    ``T // BLOCK_Q + min(B, T // 2)`` programs cover any batch without reading it on the
    host. One prefill row (the common case) takes no step.
    """
    lo = pid * 0
    hi = lo + num_prefill - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ok = tl.load(QueryStart + tl.load(Prefill + mid)) // BLOCK_Q + mid <= pid
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit(
    do_not_specialize=["window", "stride_table", "num_splits", *_SPLIT_STRIDES]
)
def _prefill_kernel(
    Out, Q, K, V, Tables, SeqLens, QueryStart, RowOrder, RowCounts, PartOut, PartLse,
    stride_ot, stride_oh, stride_qt, stride_qh,
    stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_table,
    stride_pb, stride_ps, stride_ph, stride_lb, stride_ls,
    qk_scale, v_scale, window, num_splits,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    num_prefill = tl.load(RowCounts + 1)
    if num_prefill == 0:
        return  # (a graph's warm-up, whose rows hold no tokens)
    Prefill = RowOrder + tl.load(RowCounts)
    # Highest numbers first: a sequence's last tiles see the most keys, start them early.
    # Numbers past the last tile's (a bucket's spare programs) come last and exit here.
    last = tl.load(Prefill + num_prefill - 1)
    last_start = tl.load(QueryStart + last)
    top = (last_start // BLOCK_Q + num_prefill - 1
           + tl.cdiv(tl.load(QueryStart + last + 1) - last_start, BLOCK_Q))
    pid = top - 1 - tl.program_id(2)
    if pid < 0:
        return
    k = _find_prefill_row(QueryStart, Prefill, num_prefill, pid, BLOCK_Q)
    seq = tl.load(Prefill + k)
    q_start = tl.load(QueryStart + seq)
    q_len = tl.load(QueryStart + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_Q + k)
    if (tile < 0) | (tile * BLOCK_Q >= q_len):
        return  # spare numbers do nothing
    seq_len = tl.load(SeqLens + seq)

    # Rows are (token, head) pairs: BLOCK_Q tokens x the GROUP query heads of this KV head.
    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    tok = tile * BLOCK_Q + offs_r // GROUP
    heads = kv_head * GROUP + offs_r % GROUP
    rows_ok = (offs_r < BLOCK_Q * GROUP) & (tok < q_len)
    q_ptrs = (Q + (q_start + tok)[:, None] * stride_qt + heads[:, None] * stride_qh
              + offs_d[None, :])
    q = tl.load(q_ptrs, mask=rows_ok[:, None], other=0.0)
    q_pos = seq_len - q_len + tok
    win_lo = tl.where(window > 0, tl.maximum(q_pos - window + 1, 0), 0)

    # Keys [lo, kv_end) are visible to some row of the tile, [full_lo, first] to every row:
    # masked steps over [lo, a), unmasked over [a, b), masked again over [b, kv_end).
    first, last, lo, kv_end, share, pieces = _tile_keys(
        seq_len, q_len, tile, window, num_splits, BLOCK_Q, BLOCK_N)
    full_lo = tl.where(window > 0, tl.maximum(last - window + 1, lo), lo)
    a = tl.minimum(lo + tl.cdiv(full_lo - lo, BLOCK_N) * BLOCK_N, kv_end)
    b = a + (tl.maximum(first + 1 - a, 0) // BLOCK_N) * BLOCK_N

    # A split takes its piece of [lo, kv_end), and each part of it as above; a tile whose
    # keys fit one piece is not split at all.
    s_lo, s_hi = lo, kv_end
    if SPLIT:
        if split >= pieces:
            return
        s_lo = lo + split * share
        s_hi = tl.minimum(s_lo + share, kv_end)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    K = K + kv_head * stride_kh
    V = V + kv_head * stride_vh
    table = Tables + seq * stride_table
    acc, m_i, l_i = _attend_range(
        acc, m_i, l_i, q, q_pos, win_lo, K, V, table, stride_kb, stride_kt, stride_vb, stride_vt,
        tl.maximum(lo, s_lo), tl.minimum(a, s_hi), kv_end, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, True, DOT_PRECISION,
    )
    acc, m_i, l_i = _attend_range(
        acc, m_i, l_i, q, q_pos, win_lo, K, V, table, stride_kb, stride_kt, stride_vb, stride_vt,
        tl.maximum(a, s_lo), tl.minimum(b, s_hi), kv_end, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, False, DOT_PRECISION,
    )
    acc, m_i, l_i = _attend_range(
        acc, m_i, l_i, q, q_pos, win_lo, K, V, table, stride_kb, stride_kt, stride_vb, stride_vt,
        tl.maximum(b, s_lo), s_hi, kv_end, qk_scale,
        BLOCK_N, BLOCK_SIZE, HEAD_DIM, True, DOT_PRECISION,
    )
    has_keys = l_i > 0
    out = acc * (v_scale / tl.where(has_keys, l_i, 1.0))[:, None]
    o_ptrs = (Out + (q_start + tok)[:, None] * stride_ot + heads[:, None] * stride_oh
              + offs_d[None, :])
    if SPLIT:  # noqa: SIM102 (compile-time: the unsplit kernel holds no partial stores)
        if pieces > 1:  # each piece stores its rows; ``_combine_kernel`` merges them
            part = (PartOut + (q_start + tok)[:, None] * stride_pb + split * stride_ps
                    + heads[:, None] * stride_ph + offs_d[None, :])
            tl.store(part, out, mask=rows_ok[:, None])
            lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
            tl.store(PartLse + (q_start + tok) * stride_lb + split * stride_ls + heads, lse,
                     mask=rows_ok)
            return
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=rows_ok[:, None])
# fmt: on


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def num_kv_splits(num_seqs: int, num_kv_heads: int, kv_len: int, device: torch.device) -> int:
    """How many pieces each decode row's keys are cut into (flash-decoding).

    Aims at about two programs per SM when sequences x KV heads alone would leave SMs idle,
    keeping at least 256 keys a piece (``benchmarks/results-by-topic/07-kernels.md``, 7.3).
    ``kv_len`` is an upper bound (a captured graph passes the model's maximum; pieces past a
    sequence's end exit at once).
    CPU (interpreter): 1.
    """
    if device.type != "cuda":
        return 1
    wanted = triton.cdiv(_split_programs(device, num_kv_heads), max(num_seqs, 1))
    return max(1, min(wanted, triton.cdiv(kv_len, _MIN_KEYS_PER_SPLIT), _MAX_SPLITS))


def _split_programs(device: torch.device, num_kv_heads: int) -> int:
    """Programs per KV head that decode rows' splits aim at in all: two per SM (1 on CPU)."""
    return triton.cdiv(2 * _sm_count(device), num_kv_heads) if device.type == "cuda" else 1


def prefill_rows(tile: TileConfig, group: int) -> tuple[int, int]:
    """A prefill program's rows, (token, head) pairs, and the tokens they hold."""
    block_m = max(tile.block_m, triton.next_power_of_2(group))
    return block_m, block_m // group


def num_prefill_splits(
    num_tokens: int, block_q: int, num_kv_heads: int, kv_len: int, device: torch.device
) -> int:
    """How many pieces the keys of each prefill tile are cut into.

    A few new tokens over a long context (a cached prefix) make a handful of tiles, each
    stepping through every key alone. Steps of at most ``SMALL_STEP_TOKENS`` tokens split
    them to about 1.5 programs per SM (measured best from 16 to 256 tokens,
    ``benchmarks/results-by-topic/06-prefill-caching.md``, 6.2),
    at least 256 keys a piece by ``kv_len``; ``num_tokens`` and ``kv_len`` are upper bounds
    (a graph bucket's), pieces past a tile's keys do nothing. Larger steps have tiles enough
    (splitting them was slower). CPU (interpreter): 1.
    """
    if device.type != "cuda" or num_tokens > SMALL_STEP_TOKENS:
        return 1
    tiles = triton.cdiv(num_tokens, block_q) * num_kv_heads
    wanted = round(1.5 * _sm_count(device) / tiles)
    return max(1, min(wanted, triton.cdiv(kv_len, _MIN_KEYS_PER_SPLIT), _MAX_SPLITS))


def _check_inputs(q: Tensor, k_cache: Tensor, v_cache: Tensor) -> None:
    head_dim = q.shape[-1]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"paged attention needs a power-of-two head_dim >= 16, got {head_dim}")
    if q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads do not group over {k_cache.shape[1]} KV heads")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged attention needs a contiguous last (head_dim) dimension")


def max_decode_queries(group: int) -> int:
    """The most query tokens a decode row may have (``decode_queries``) with ``group`` query
    heads a KV head: their (token, head) rows fill one tile of at most 64 rows."""
    return max(_MAX_DECODE_TILE_ROWS // group, 1)


def _check_decode_queries(meta: RaggedBatch, group: int) -> None:
    queries = meta.decode_queries
    if queries == 1:
        return
    most = max_decode_queries(group)
    if not 1 <= queries <= most:
        raise ValueError(f"decode_queries must be in [1, {most}], got {queries}")
    if meta.max_query_len > queries:
        raise ValueError(f"a row has {meta.max_query_len} query tokens, decode_queries {queries}")


def _dot_precision(q: Tensor) -> str:
    return "ieee" if q.dtype == torch.float32 else "tf32"


def new_split_scratch(
    shape: tuple[int, ...], counters: tuple[int, int], device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """Split partials ``[rows, S, H, D]``, log-sum-exps ``[rows, S, H]`` and finished-split
    counters ``[programs, Hkv]`` (zero between calls: the merging program resets its own);
    callers may share one set between the layers of a step."""
    return (
        torch.empty(shape, dtype=torch.float32, device=device),
        torch.empty(shape[:3], dtype=torch.float32, device=device),
        torch.zeros(counters, dtype=torch.int32, device=device),
    )


def _launch_decode(
    out: Tensor, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: RaggedBatch,
    scale: float, window: int, num_splits: int, row_splits: int, tile: TileConfig,
    scratch: SplitScratch, kv_scales: tuple[float, float],
) -> None:  # fmt: skip
    num_seqs, (_, num_heads, head_dim) = meta.num_seqs, q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    group, queries = num_heads // num_kv_heads, meta.decode_queries
    if num_splits > 1:
        shape = (num_seqs, num_splits, queries * num_heads, head_dim)
        part_out, part_lse, counters = scratch(shape, (num_seqs, num_kv_heads))
    else:  # the kernel writes ``out`` itself and never touches the partials
        part_out, part_lse, counters = out[:, :, :, None], out[:, :, 0], meta.seq_lens
    merge = 1 < num_splits <= _MAX_SPLITS_MERGED_IN_KERNEL
    tables, starts = meta.block_tables, meta.query_start_loc
    _decode_kernel[(num_kv_heads, num_splits, num_seqs)](
        out, q, k_cache, v_cache, tables, meta.seq_lens, starts, meta.row_order, meta.row_counts,
        part_out, part_lse, counters,
        out.stride(0), out.stride(1), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        scale * kv_scales[0] * _LOG2E, float(kv_scales[1]), window, num_splits, row_splits,
        int(merge),
        GROUP=group, ROWS=max(tile.block_m, triton.next_power_of_2(queries * group)),
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_N=tile.block_n, SPLIT=num_splits > 1,
        DOT_PRECISION=_dot_precision(q), DECODE_ONLY=meta.max_query_len <= queries,
        QUERIES=queries, num_warps=tile.num_warps, num_stages=tile.num_stages,
        **pdl_launch(q),
    )  # fmt: skip
    if num_splits > 1 and not merge:
        _launch_combine(out, part_out, part_lse, meta, num_splits, row_splits)


def _launch_combine(
    out: Tensor, part_out: Tensor, part_lse: Tensor, meta: RaggedBatch, num_splits: int,
    row_splits: int = 0, prefill_tile: tuple[int, int, int] | None = None,
) -> None:  # fmt: skip
    """Merge the split partials of every decode row, or with ``prefill_tile`` (window, tokens
    and keys a step of the prefill kernel's tiles) of every prefill token."""
    window, block_q, block_n = prefill_tile or (0, 1, 16)
    _combine_kernel[(part_out.shape[2], part_out.shape[0])](
        out, part_out, part_lse, meta.query_start_loc, meta.seq_lens, meta.row_order,
        meta.row_counts, meta.token_rows, window,
        out.stride(0), out.stride(1), part_out.stride(0), part_out.stride(1),
        part_out.stride(2), part_lse.stride(0), part_lse.stride(1), num_splits, row_splits,
        SPLITS_POW2=triton.next_power_of_2(num_splits), HEAD_DIM=part_out.shape[3],
        PREFILL=prefill_tile is not None, DECODE_ONLY=meta.max_query_len <= meta.decode_queries,
        BLOCK_Q=block_q, BLOCK_N=block_n, QUERIES=1 if prefill_tile else meta.decode_queries,
        num_warps=4, **pdl_launch(out),
    )  # fmt: skip


def _launch_prefill(
    out: Tensor, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: RaggedBatch,
    scale: float, window: int, num_splits: int, tile: TileConfig, scratch: SplitScratch,
    kv_scales: tuple[float, float],
) -> None:  # fmt: skip
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    block_m, block_q = prefill_rows(tile, num_heads // num_kv_heads)
    programs = num_tokens // block_q + min(meta.num_seqs, num_tokens // 2)
    if num_splits > 1:  # (no counters: the partials are merged by a kernel of their own)
        shape = (num_tokens, num_splits, num_heads, head_dim)
        part_out, part_lse, _ = scratch(shape, (1, 1))
    else:  # the kernel writes ``out`` itself and never touches the partials
        part_out, part_lse = out[:, :, :, None], out[:, :, 0]
    tables = meta.block_tables
    _prefill_kernel[(num_kv_heads, num_splits, programs)](
        out, q, k_cache, v_cache, tables, meta.seq_lens, meta.query_start_loc, meta.row_order,
        meta.row_counts, part_out, part_lse,
        out.stride(0), out.stride(1), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        scale * kv_scales[0] * _LOG2E, float(kv_scales[1]), window, num_splits,
        GROUP=num_heads // num_kv_heads, BLOCK_M=block_m, BLOCK_Q=block_q, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=tile.block_n, SPLIT=num_splits > 1,
        DOT_PRECISION=_dot_precision(q), num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip
    if num_splits > 1:
        _launch_combine(
            out, part_out, part_lse, meta, num_splits, prefill_tile=(window, block_q, tile.block_n)
        )


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: RaggedBatch,
    scale: float,
    sliding_window: int = 0,
    *,
    scratch: SplitScratch | None = None,
    num_splits: int | None = None,
    prefill_splits: int | None = None,
    decode_tile: TileConfig | None = None,
    prefill_tile: TileConfig | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> Tensor:
    """Attention of ``q [T, H, D]`` over the paged cache ``[N, Hkv, BS, D]`` → ``[T, H, D]``.

    Same contract as ``paged_attention_torch`` (this step's K/V are already in the cache,
    an FP8 cache's divided by ``kv_scales``: the keys are widened as they are loaded, and
    the two scales multiply the scores and the output instead of every element). A
    decode batch (``max_query_len`` at most ``decode_queries``, 1 unless a step verifies
    proposals) runs the decode kernel alone; otherwise the decode kernel serves the one-query
    rows and the prefill kernel the others. The keyword arguments
    override the heuristics (the tests and the kernel benchmark use them); ``scratch``
    supplies the split-KV buffers (new ones per call by default).
    """
    _check_inputs(q, k_cache, v_cache)
    _check_decode_queries(meta, q.shape[1] // k_cache.shape[1])
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0:
        return out
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    kv_len = min(meta.max_seq_len, sliding_window) if sliding_window > 0 else meta.max_seq_len
    rows = meta.split_rows or meta.num_seqs
    splits = num_splits or num_kv_splits(rows, num_kv_heads, kv_len, q.device)
    # An override splits every row as asked; otherwise the kernel shares the programs that
    # ``num_kv_splits`` aims at between the step's actual decode rows.
    row_splits = splits * meta.num_seqs if num_splits else _split_programs(q.device, num_kv_heads)
    tile = decode_tile or decode_config(head_dim)
    if scratch is None:
        scratch = functools.partial(new_split_scratch, device=q.device)
    _launch_decode(
        out, q, k_cache, v_cache, meta, scale, sliding_window, splits, row_splits, tile, scratch,
        kv_scales,
    )  # fmt: skip
    if meta.max_query_len > meta.decode_queries:
        tile = prefill_tile or prefill_config(
            head_dim, meta.max_seq_len, q.element_size(), num_tokens
        )
        block_q = prefill_rows(tile, num_heads // num_kv_heads)[1]
        splits = prefill_splits or num_prefill_splits(
            num_tokens, block_q, num_kv_heads, kv_len, q.device
        )
        _launch_prefill(
            out, q, k_cache, v_cache, meta, scale, sliding_window, splits, tile, scratch,
            kv_scales,
        )  # fmt: skip
    return out


def triton_paged_attention(
    q: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    *,
    scale: float,
    max_num_blocks: int,
    window_size: int = 0,
) -> Tensor:
    """Decode attention over a page table: ``q [B, H, 1, D]`` → ``[B, H, 1, D]``.

    Sequence ``b``'s query sits at position ``seq_lens[b] - 1`` and sees the keys before it,
    only the last ``window_size`` of them when ``window_size > 0``.
    """
    batch, device = q.shape[0], q.device
    rows = torch.arange(batch + 1, dtype=torch.int32, device=device)
    meta = RaggedBatch(
        block_tables=page_table[:, :max_num_blocks],
        seq_lens=seq_lens,
        query_start_loc=rows,
        max_query_len=1,
        max_seq_len=max_num_blocks * k_pool.shape[2],
        row_order=rows[:batch],
        row_counts=torch.tensor([batch, 0], dtype=torch.int32, device=device),
        token_rows=rows[:batch],
    )
    out = paged_attention(q[:, :, 0], k_pool, v_pool, meta, scale, window_size)
    return out.unsqueeze(2)
