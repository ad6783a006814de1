"""Triton kernel of ``sampling.sample_filtered``: one program per row makes a few passes over
the row's logits (a max for min-p and top-k, which also finds top-k's threshold from each
lane's four largest values; counting passes only where a lane hid more; one Gumbel-max draw;
one more per rejected top-p draw), so sampling reads the logits a few times and writes
nothing but the row's token."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.sampling import (
    HASH_MULTIPLIER,
    MAX_ROUNDS,
    ROUND_STRIDE,
    SMALLEST_EXPONENTIAL,
    RowSettings,
    TokenMask,
)

_MULTIPLIER = tl.constexpr(HASH_MULTIPLIER)
_ROUND_STRIDE = tl.constexpr(ROUND_STRIDE)
_SMALLEST_EXPONENTIAL = tl.constexpr(SMALLEST_EXPONENTIAL)
_MAX_ROUNDS = tl.constexpr(MAX_ROUNDS)
_MAX_BLOCK = 1024
_PIVOTS = 8
_STAGES = 3


@triton.jit
def _mix32(x):
    x = ((x >> 16) ^ x) * _MULTIPLIER
    x = ((x >> 16) ^ x) * _MULTIPLIER
    return (x >> 16) ^ x


@triton.jit
def _load_scaled(
    row_ptr,
    mask_ptr,
    mask_row,
    words,
    start,
    vocab,
    inverse_t,
    BLOCK: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    """A block's indices and ``logits / T``: -inf past the vocabulary and where the mask
    forbids."""
    offs = start + tl.arange(0, BLOCK)
    inside = offs < vocab
    x = tl.load(row_ptr + offs, mask=inside, other=float("-inf")).to(tl.float32)
    z = x * inverse_t
    if HAS_MASK:
        # A row without a mask (-1) reads mask 0's words and ignores them.
        word = tl.load(mask_ptr + tl.maximum(mask_row, 0) * words + (offs >> 5), mask=inside)
        allowed = (mask_row < 0) | (((word >> (offs & 31)) & 1) != 0)
        z = tl.where(allowed, z, float("-inf"))
    return offs, z


@triton.jit
def _ln(x, FAST: tl.constexpr):
    """Natural log; ``FAST``: the hardware's approximate log2 (not in the interpreter)."""
    if FAST:
        log2 = tl.inline_asm_elementwise(
            "lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
        return log2 * 0.6931471805599453
    return tl.log(x)


@triton.jit
def _gumbel(key, offs, FAST_LOG: tl.constexpr):
    """The Gumbel noise of ``sampling.gumbel_noise`` for a block of vocabulary indices, from
    the round's ``key`` (``sampling.round_key``)."""
    x = _mix32(key ^ offs.to(tl.uint32))
    uniform = ((x >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    exponential = tl.maximum(-_ln(uniform, FAST_LOG), _SMALLEST_EXPONENTIAL)
    return -_ln(exponential, FAST_LOG)


@triton.jit
def _insert(a, b, c, d, z):
    """Each lane's four largest values so far (``a >= b >= c >= d``) with ``z`` offered."""
    a, z = tl.maximum(a, z), tl.minimum(a, z)
    b, z = tl.maximum(b, z), tl.minimum(b, z)
    c, z = tl.maximum(c, z), tl.minimum(c, z)
    return a, b, c, tl.maximum(d, z)


# Every pass keeps per-lane accumulators and reduces them once at its end: a reduction in
# the loop would make each block wait on the one before. Only the mask and top-p (whose
# weights cost an exp an element) are compile-time switches: each variant compiles once.
@triton.jit
def _sample_kernel(
    logits_ptr, stride, out_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr,
    mask_ptr, mask_rows_ptr, words, vocab,
    HAS_MASK: tl.constexpr, USE_TOP_P: tl.constexpr, BLOCK: tl.constexpr,
    PIVOTS: tl.constexpr, STAGES: tl.constexpr, FAST_LOG: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    temperature = tl.load(temperature_ptr + row)
    noisy = temperature > 0
    inverse_t = tl.math.div_rn(1.0, tl.where(noisy, temperature, 1.0))
    mask_row = -1
    if HAS_MASK:
        mask_row = tl.load(mask_rows_ptr + row)
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    low = (seed & 0xFFFFFFFF).to(tl.uint32)
    high = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    row_hash = _mix32(_mix32(low ^ _mix32(high)) ^ (step & 0xFFFFFFFF).to(tl.uint32))

    # min-p and top-k need the row's largest (and smallest) z first; top-k, each lane's four
    # largest: the k-th largest of those is the row's k-th largest unless a lane holds more
    # than four values above it, which its fourth largest tells.
    k = tl.where(noisy, tl.load(top_k_ptr + row).to(tl.int32), vocab)
    min_p = tl.where(noisy, tl.load(min_p_ptr + row), 0.0)
    top = tl.full([], -float("inf"), tl.float32)
    least = tl.full([], float("inf"), tl.float32)
    lane_kth = tl.full([], -float("inf"), tl.float32)
    exact_kth = tl.full([], False, tl.int1)
    if (min_p > 0) | (k < vocab):
        tops = tl.full([BLOCK], -float("inf"), tl.float32)
        seconds = tl.full([BLOCK], -float("inf"), tl.float32)
        thirds = tl.full([BLOCK], -float("inf"), tl.float32)
        fourths = tl.full([BLOCK], -float("inf"), tl.float32)
        leasts = tl.full([BLOCK], float("inf"), tl.float32)
        for start in tl.range(0, vocab, BLOCK, num_stages=STAGES):
            _, z = _load_scaled(
                row_ptr, mask_ptr, mask_row, words, start, vocab, inverse_t, BLOCK, HAS_MASK
            )
            tops, seconds, thirds, fourths = _insert(tops, seconds, thirds, fourths, z)
            leasts = tl.minimum(leasts, tl.where(z > -float("inf"), z, float("inf")))
        top = tl.max(tops, 0)
        least = tl.min(leasts, 0)
        if (k < vocab) & (k <= 4 * BLOCK):
            lanes = tl.reshape(
                tl.join(tl.join(tops, seconds), tl.join(thirds, fourths)), [4 * BLOCK]
            )
            lane_kth = _kth_largest(lanes, k)
            exact_kth = tl.max(fourths, 0) <= lane_kth
    threshold = tl.full([], -float("inf"), tl.float32)  # the lowest z kept
    if min_p > 0:
        threshold = top + tl.log(min_p)

    if (k < vocab) & exact_kth:
        threshold = tl.maximum(threshold, lane_kth)
    elif k < vocab:
        # top-k where a lane hid values: a threshold t with {z >= t} = {z >= the k-th
        # largest z}. Each pass counts the z at or above PIVOTS points spread over the band
        # [lo, hi] that holds the k-th largest, narrows the band to the two points around
        # it, snaps it to the z inside it, and stops when exactly k are kept or one value
        # is left in the band.
        lo = tl.maximum(tl.maximum(least, threshold), lane_kth)
        hi = top
        hi_inclusive = tl.full([], True, tl.int1)
        searching = lo < hi
        if lo >= hi:  # the band holds one value: it is the k-th largest
            threshold = tl.maximum(threshold, lo)
        passes = tl.zeros([], dtype=tl.int32)
        fractions = tl.arange(0, PIVOTS).to(tl.float32) / PIVOTS
        while searching:
            pivots = lo + (hi - lo) * fractions
            counts = tl.zeros([PIVOTS, BLOCK], dtype=tl.int32)
            band_lows = tl.full([BLOCK], float("inf"), tl.float32)
            band_highs = tl.full([BLOCK], -float("inf"), tl.float32)
            for start in tl.range(0, vocab, BLOCK, num_stages=STAGES):
                _, z = _load_scaled(
                    row_ptr, mask_ptr, mask_row, words, start, vocab, inverse_t, BLOCK, HAS_MASK
                )
                z = tl.where(z >= threshold, z, -float("inf"))
                counts += (z[None, :] >= pivots[:, None]).to(tl.int32)
                band = (z >= lo) & tl.where(hi_inclusive, z <= hi, z < hi)
                band_lows = tl.minimum(band_lows, tl.where(band, z, float("inf")))
                band_highs = tl.maximum(band_highs, tl.where(band, z, -float("inf")))
            at_least = tl.sum(counts, 1)
            band_low = tl.min(band_lows, 0)
            band_high = tl.max(band_highs, 0)
            index = tl.max(tl.where(at_least >= k, tl.arange(0, PIVOTS), -1), 0)
            kept = tl.sum(tl.where(tl.arange(0, PIVOTS) == index, at_least, 0), 0)
            passes += 1
            if index < 0:  # fewer than k candidates: no cut
                searching = False
            elif (kept == k) | (band_low == band_high) | (passes >= 64):
                threshold = tl.where(kept == k, _at(pivots, index), band_low)
                searching = False
            else:
                lo = tl.maximum(_at(pivots, index), band_low)
                if index < PIVOTS - 1:
                    hi = _at(pivots, index + 1)
                    hi_inclusive = hi > band_high
                hi = tl.minimum(hi, band_high)
                hi_inclusive = hi_inclusive | (hi == band_high)

    # Gumbel-max draws; round r > 0 redraws above the rejected z (top-p by rejection) and
    # weighs the mass above it in the same pass.
    top_p = 1.0
    if USE_TOP_P:
        top_p = tl.where(noisy, tl.load(top_p_ptr + row), 1.0)
    pending = tl.full([], True, tl.int1)
    round_ = tl.zeros([], dtype=tl.int32)
    choice = tl.zeros([], dtype=tl.int32)
    chosen = tl.full([], -float("inf"), tl.float32)
    while pending:
        bests = tl.full([BLOCK], -float("inf"), tl.float32)
        best_indices = tl.zeros([BLOCK], dtype=tl.int32)
        best_zs = tl.full([BLOCK], -float("inf"), tl.float32)
        tops = tl.full([BLOCK], -float("inf"), tl.float32)
        totals = tl.zeros([BLOCK], dtype=tl.float32)
        aboves = tl.zeros([BLOCK], dtype=tl.float32)
        key = _mix32(row_hash + round_.to(tl.uint32) * _ROUND_STRIDE)
        for start in tl.range(0, vocab, BLOCK, num_stages=STAGES):
            offs, z = _load_scaled(
                row_ptr, mask_ptr, mask_row, words, start, vocab, inverse_t, BLOCK, HAS_MASK
            )
            kept = (z > -float("inf")) & (z >= threshold)
            candidate = kept & (z > chosen)
            noise = tl.where(noisy, _gumbel(key, offs, FAST_LOG), 0.0)
            score = tl.where(candidate, z + noise, -float("inf"))
            better = score > bests
            bests = tl.where(better, score, bests)
            best_indices = tl.where(better, offs, best_indices)
            best_zs = tl.where(better, z, best_zs)
            if USE_TOP_P:
                tops = tl.maximum(tops, tl.where(kept, z, -float("inf")))
                weight = tl.where(kept, tl.exp(z - top), 0.0)  # top: -inf in round 0
                totals += weight
                aboves += tl.where(candidate, weight, 0.0)
        best = tl.max(bests, 0)
        best_index = tl.min(tl.where(bests == best, best_indices, vocab), 0)
        best_z = tl.max(tl.where(best_indices == best_index, best_zs, -float("inf")), 0)
        if round_ == 0:
            top = tl.max(tops, 0)
            pending = top_p < 1.0
            choice = best_index
            chosen = best_z
        else:
            rejected = tl.sum(aboves, 0) >= top_p * tl.sum(totals, 0)
            pending = rejected & (round_ + 1 < _MAX_ROUNDS)
            if rejected:
                choice = best_index
                chosen = best_z
        round_ += 1
    tl.store(out_ptr + row, choice.to(tl.int64))


@triton.jit
def _kth_largest(values, k):
    """The ``k``-th largest of ``values`` counted with repeats (``sort(values)[-k]``), by
    bisection over the bits of an order-keeping unsigned image of the floats: 32 counts,
    where a sort of the block would be most of this kernel's compiled code and its compile
    time."""
    bits = values.to(tl.uint32, bitcast=True)
    sign = tl.full([], 1, tl.uint32) << 31
    keys = tl.where((bits & sign) != 0, ~bits, bits | sign)  # negatives reversed, below
    answer = tl.zeros([], dtype=tl.uint32)
    for i in range(32):  # the largest key with at least k keys at or above it
        candidate = answer | (tl.full([], 1, tl.uint32) << (31 - i))
        answer = tl.where(tl.sum((keys >= candidate).to(tl.int32), 0) >= k, candidate, answer)
    return tl.where((answer & sign) != 0, answer & ~sign, ~answer).to(tl.float32, bitcast=True)


@triton.jit
def _at(values, index):
    """``values[index]`` of a 1-D block."""
    return tl.sum(tl.where(tl.arange(0, values.shape[0]) == index, values, 0.0), 0)


def sample_filtered_triton(logits: Tensor, rows: RowSettings, mask: TokenMask | None) -> Tensor:
    batch, vocab = logits.shape
    settings = (rows.temperature, rows.top_k, rows.top_p, rows.min_p, rows.seeds, rows.steps)
    if logits.stride(-1) != 1 or any(t.shape != (batch,) or t.stride(0) != 1 for t in settings):
        raise ValueError("logits: rows of unit stride, and [B] contiguous settings, are needed")
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    bits = mask.bits if mask is not None else out  # unread without a mask
    mask_rows = mask.rows if mask is not None else out
    _sample_kernel[(batch,)](
        logits, logits.stride(0), out,
        rows.temperature, rows.top_k, rows.top_p, rows.min_p, rows.seeds, rows.steps,
        bits, mask_rows, bits.shape[-1] if mask is not None else 0, vocab,
        HAS_MASK=mask is not None, USE_TOP_P=rows.use_top_p,
        BLOCK=min(_MAX_BLOCK, triton.next_power_of_2(vocab)), PIVOTS=_PIVOTS,
        STAGES=_STAGES, FAST_LOG=os.environ.get("TRITON_INTERPRET") != "1", num_warps=8,
    )  # fmt: skip
    return out
