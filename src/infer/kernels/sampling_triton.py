"""Triton kernel of ``sampling.sample_filtered``: one program per row makes a few passes over
the row's logits (a max for min-p, four radix-histogram passes for top-k's threshold, one
Gumbel-max draw, one more per rejected top-p draw), so sampling reads the logits a handful of
times and writes nothing but the row's token."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.sampling import HASH_MULTIPLIER, ROUND_STRIDE, RowSettings, TokenMask

_MULTIPLIER = tl.constexpr(HASH_MULTIPLIER)
_ROUND_STRIDE = tl.constexpr(ROUND_STRIDE)
_MAX_BLOCK = 2048


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
    temperature,
    BLOCK: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    """A block's indices, ``logits / T`` (-inf past the vocabulary and where the mask
    forbids) and their order keys."""
    offs = start + tl.arange(0, BLOCK)
    inside = offs < vocab
    x = tl.load(row_ptr + offs, mask=inside, other=float("-inf")).to(tl.float32)
    z = tl.math.div_rn(x, temperature)
    if HAS_MASK:
        # A row without a mask (-1) reads mask 0's words and ignores them.
        word = tl.load(mask_ptr + tl.maximum(mask_row, 0) * words + (offs >> 5), mask=inside)
        allowed = (mask_row < 0) | (((word >> (offs & 31)) & 1) != 0)
        z = tl.where(allowed, z, float("-inf"))
    # uint32 keys in the order of the values (negatives: all bits but the sign flip).
    bits = z.to(tl.int32, bitcast=True)
    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF) ^ -2147483648).to(tl.uint32, bitcast=True)
    return offs, z, key


@triton.jit
def _gumbel(row_hash, offs, round_offset):
    """The Gumbel noise of ``sampling.gumbel_noise`` for a block of vocabulary indices."""
    x = row_hash ^ offs.to(tl.uint32)
    for i in tl.static_range(2):  # mix32 twice (inlined), the round's offset between them
        if i == 1:
            x = x + round_offset
        x = ((x >> 16) ^ x) * _MULTIPLIER
        x = ((x >> 16) ^ x) * _MULTIPLIER
        x = (x >> 16) ^ x
    uniform = ((x >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    return -tl.log(-tl.log(uniform))


@triton.jit
def _sample_kernel(
    logits_ptr, stride, out_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, step_ptr,
    mask_ptr, mask_rows_ptr, words, vocab,
    HAS_MASK: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr,
    USE_MIN_P: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    temperature = tl.load(temperature_ptr + row)
    noisy = temperature > 0
    temperature = tl.where(noisy, temperature, 1.0)
    mask_row = -1
    if HAS_MASK:
        mask_row = tl.load(mask_rows_ptr + row)
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    low = (seed & 0xFFFFFFFF).to(tl.uint32)
    high = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    row_hash = _mix32(_mix32(low ^ _mix32(high)) ^ (step & 0xFFFFFFFF).to(tl.uint32))

    floor = tl.full([], -float("inf"), tl.float32)  # min-p: the lowest z kept
    if USE_MIN_P:
        min_p = tl.load(min_p_ptr + row)
        if noisy & (min_p > 0):
            top = tl.full([], -float("inf"), tl.float32)
            for start in range(0, vocab, BLOCK):
                _, z, _ = _load_scaled(
                    row_ptr, mask_ptr, mask_row, words, start, vocab, temperature, BLOCK, HAS_MASK
                )
                top = tl.maximum(top, tl.max(z, 0))
            floor = top + tl.log(min_p)

    kth_key = tl.zeros([], dtype=tl.uint32)  # top-k: the lowest key kept
    if USE_TOP_K:
        k = tl.load(top_k_ptr + row).to(tl.int32)
        if noisy & (k < vocab):
            # Radix select of the k-th largest key, 8 bits a pass: each pass histograms the
            # next digit of the keys that share the digits chosen so far.
            above = tl.zeros([], dtype=tl.int32)  # keys known to be larger than the prefix
            prefix = tl.zeros([], dtype=tl.uint32)
            bins = tl.arange(0, 256)
            enough = tl.full([], True, tl.int1)
            for p in tl.static_range(4):
                shift = 24 - 8 * p
                counts = tl.zeros([256], dtype=tl.int32)
                for start in range(0, vocab, BLOCK):
                    _, z, key = _load_scaled(
                        row_ptr,
                        mask_ptr,
                        mask_row,
                        words,
                        start,
                        vocab,
                        temperature,
                        BLOCK,
                        HAS_MASK,
                    )
                    eligible = (z > -float("inf")) & (z >= floor)
                    if p > 0:
                        eligible = eligible & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
                    digit = ((key >> shift) & 0xFF).to(tl.int32)
                    counts += tl.histogram(digit, 256, mask=eligible)
                at_least = above + tl.cumsum(counts, 0, reverse=True)  # keys >= each digit
                digit_k = tl.max(tl.where(at_least >= k, bins, -1), 0)
                if p == 0:
                    enough = digit_k >= 0  # fewer than k candidates: no cut
                digit_k = tl.maximum(digit_k, 0)
                above = tl.sum(tl.where(bins == digit_k, at_least - counts, 0), 0)
                prefix = prefix | (digit_k.to(tl.uint32) << shift)
            kth_key = tl.where(enough, prefix, kth_key)

    # Gumbel-max draws; round r > 0 redraws above the rejected z (top-p by rejection) and
    # weighs the mass above it in the same pass.
    top_p = tl.full([], 1.0, tl.float32)
    if USE_TOP_P:
        top_p = tl.where(noisy, tl.load(top_p_ptr + row), 1.0)
    pending = tl.full([], True, tl.int1)
    round_ = tl.zeros([], dtype=tl.int32)
    choice = tl.zeros([], dtype=tl.int32)
    chosen = tl.full([], -float("inf"), tl.float32)
    total = tl.zeros([], dtype=tl.float32)
    top = tl.full([], -float("inf"), tl.float32)
    while pending:
        best = tl.full([], -float("inf"), tl.float32)
        best_index = tl.zeros([], dtype=tl.int32)
        best_z = tl.full([], -float("inf"), tl.float32)
        mass = tl.zeros([], dtype=tl.float32)
        reference = tl.full([], -float("inf"), tl.float32)
        offset = round_.to(tl.uint32) * _ROUND_STRIDE
        for start in range(0, vocab, BLOCK):
            offs, z, key = _load_scaled(
                row_ptr, mask_ptr, mask_row, words, start, vocab, temperature, BLOCK, HAS_MASK
            )
            candidate = (z > chosen) & (z >= floor)
            if USE_TOP_K:
                candidate = candidate & (key >= kth_key)
            noise = tl.where(noisy, _gumbel(row_hash, offs, offset), 0.0)
            score = tl.where(candidate, z + noise, -float("inf"))
            block_best = tl.max(score, 0)
            if block_best > best:
                best = block_best
                best_index = start + tl.argmax(score, 0)
                best_z = tl.max(tl.where(offs == best_index, z, -float("inf")), 0)
            if USE_TOP_P:
                kept = tl.where(candidate, z, -float("inf"))
                new_reference = tl.maximum(reference, tl.max(kept, 0))
                scale = tl.where(
                    new_reference > -float("inf"), tl.exp(reference - new_reference), 0.0
                )
                weights = tl.where(candidate, tl.exp(kept - new_reference), 0.0)
                mass = mass * scale + tl.sum(weights, 0)
                reference = new_reference
        if round_ == 0:
            total = mass
            top = reference
            pending = top_p < 1.0
        else:
            above = mass * tl.exp(reference - top)
            pending = above >= top_p * total
        if (round_ == 0) | pending:
            choice = best_index
            chosen = best_z
        round_ += 1
    tl.store(out_ptr + row, choice.to(tl.int64))


def sample_filtered_triton(logits: Tensor, rows: RowSettings, mask: TokenMask | None) -> Tensor:
    batch, vocab = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    bits = mask.bits if mask is not None else out  # unread without a mask
    mask_rows = mask.rows if mask is not None else out
    _sample_kernel[(batch,)](
        logits, logits.stride(0), out,
        rows.temperature, rows.top_k, rows.top_p, rows.min_p, rows.seeds, rows.steps,
        bits, mask_rows, bits.shape[-1] if mask is not None else 0, vocab,
        HAS_MASK=mask is not None, USE_TOP_K=rows.use_top_k, USE_TOP_P=rows.use_top_p,
        USE_MIN_P=rows.use_min_p, BLOCK=min(_MAX_BLOCK, triton.next_power_of_2(vocab)), num_warps=8,
    )  # fmt: skip
    return out
