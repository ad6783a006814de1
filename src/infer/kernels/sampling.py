"""Filtered sampling of one token per row: temperature, min-p, top-k, top-p, a grammar's
token bitmask, and greedy rows, from a counter-based hash so that a seeded row draws the same
token whatever shares its batch.

The algorithm, shared by the torch reference here and the Triton kernel
(``sampling_triton``), never sorts the vocabulary:

1. ``z = logits * (1 / T)`` over the tokens the bitmask allows (greedy rows: their argmax).
2. min-p keeps ``z >= max(z) + log(min_p)``; top-k keeps ``z >=`` the k-th largest
   remaining ``z`` (ties kept, as vLLM does). Together they leave a set ``B``.
3. A Gumbel-max draw over ``B`` (``argmax z + g``, ``g = -log(-log(u))``) samples the
   softmax restricted to ``B`` exactly.
4. top-p by rejection (as FlashInfer's sampling kernels do): a draw ``j`` is accepted when the
   mass of ``B`` strictly above ``z_j`` is below ``top_p``; otherwise the next round draws
   from ``{z > z_j}`` with fresh noise. Every set drawn from contains the top-p set, so an
   accepted draw follows the top-p-filtered softmax exactly; a round needs one pass and most
   draws are accepted at once (the top-p set holds at least ``top_p`` of the mass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from infer.kernels.dispatch import use_triton

MASK32 = 0xFFFFFFFF
HASH_MULTIPLIER = 0x45D9F3B  # < 2**31, so products of 32-bit values fit in int64
ROUND_STRIDE = 0x9E3779B9  # each rejection round offsets the hash by this (mod 2**32)
# -log(u) is kept above this, so the Gumbel noise stays finite where an approximate log of a
# u next to 1 comes out at or above 0.
SMALLEST_EXPONENTIAL = 2.0**-40
# The rounds of top-p by rejection are bounded (each accepts with probability at least
# top_p, and the pool it draws from shrinks every round): a safety net, never reached.
MAX_ROUNDS = 64


@dataclass
class RowSettings:
    """Each row's sampling settings as device tensors ``[B]``."""

    temperature: Tensor  # float32; 0 = greedy
    top_k: Tensor  # int64; the vocabulary size where unlimited
    top_p: Tensor  # float32; 1 = off
    min_p: Tensor  # float32; 0 = off
    seeds: Tensor  # int64
    steps: Tensor  # int64: which output the row samples (fresh noise for each)
    use_top_k: bool  # whether any row limits top-k / top-p (skips their work)
    use_top_p: bool

    @classmethod
    def greedy(cls, batch: int, device: torch.device) -> RowSettings:
        """Settings that make every row take its argmax."""
        zeros = torch.zeros(batch, device=device)
        ints = torch.zeros(batch, dtype=torch.int64, device=device)
        return cls(zeros, ints, zeros + 1, zeros, ints, ints, False, False)


@dataclass
class TokenMask:
    """Grammar masks: bit ``t % 32`` of word ``t // 32`` set where token ``t`` is allowed."""

    bits: Tensor  # [R, ceil(V / 32)] int32
    rows: Tensor  # [B] int32: each row's mask in ``bits``, -1 where the row has none


def mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash with good avalanche (values kept in int64, below 2**32)."""
    x = (((x >> 16) ^ x) * HASH_MULTIPLIER) & MASK32
    x = (((x >> 16) ^ x) * HASH_MULTIPLIER) & MASK32
    return (x >> 16) ^ x


def row_hash(seeds: Tensor, steps: Tensor) -> Tensor:
    """``[B]`` 32-bit hashes of each row's ``(seed, step)``."""
    low, high = seeds & MASK32, (seeds >> 32) & MASK32
    return mix32(mix32(low ^ mix32(high)) ^ (steps & MASK32))


def round_key(hashes: Tensor, round_: int) -> Tensor:
    """Each row's key for one rejection round: an element's noise is one ``mix32`` of the key
    and its index, so the per-element work is a single hash."""
    return mix32((hashes + round_ * ROUND_STRIDE) & MASK32)


def uniform_noise(seeds: Tensor, steps: Tensor, vocab_size: int, round_: int = 0) -> Tensor:
    """``[B, V]`` uniform (0, 1) values determined by each row's ``(seed, step)`` and the
    rejection round."""
    index = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = mix32(round_key(row_hash(seeds, steps), round_)[:, None] ^ index[None, :])
    return ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))  # 23 bits: never rounds to 1


def gumbel_noise(seeds: Tensor, steps: Tensor, vocab_size: int, round_: int) -> Tensor:
    exponential = -torch.log(uniform_noise(seeds, steps, vocab_size, round_))
    return -torch.log(exponential.clamp(min=SMALLEST_EXPONENTIAL))


def unpack_mask(mask: TokenMask, vocab_size: int) -> Tensor:
    """``[B, V]`` bool: where each row may sample (rows without a mask: everywhere)."""
    # Unpacked a byte at a time (the words are little-endian: byte j of word w holds
    # tokens 32w + 8j ..).
    octets = mask.bits.view(torch.uint8)
    shifts = torch.arange(8, dtype=torch.uint8, device=octets.device)
    allowed = ((octets[:, :, None] >> shifts) & 1).flatten(1)[:, :vocab_size] != 0
    rows = mask.rows.long()
    unmasked = torch.ones(1, vocab_size, dtype=torch.bool, device=allowed.device)
    return torch.cat([allowed, unmasked])[torch.where(rows < 0, len(allowed), rows)]


def sample_filtered_torch(logits: Tensor, rows: RowSettings, mask: TokenMask | None) -> Tensor:
    """Reference: one token per row of ``logits [B, V]``, as the module docstring says."""
    vocab_size = logits.shape[-1]
    greedy = rows.temperature == 0
    z = logits.float() * torch.where(greedy, 1.0, rows.temperature).reciprocal()[:, None]
    if mask is not None:
        z = z.masked_fill(~unpack_mask(mask, vocab_size), float("-inf"))
    top = z.max(dim=-1, keepdim=True).values
    floor = torch.where(rows.min_p > 0, top[:, 0] + torch.log(rows.min_p), float("-inf"))
    keep = (z > float("-inf")) & (z >= floor[:, None])
    if rows.use_top_k:
        kept = torch.where(keep, z, float("-inf"))
        ordered = kept.sort(dim=-1, descending=True).values
        kth = ordered.gather(1, (rows.top_k.clamp(1, vocab_size) - 1)[:, None])
        keep &= z >= kth  # -inf where fewer than k remain: all kept
    z = torch.where(keep, z, float("-inf"))

    def draw(round_: int, above: Tensor) -> tuple[Tensor, Tensor]:
        noise = gumbel_noise(rows.seeds, rows.steps, vocab_size, round_)
        choice = torch.where(z > above[:, None], z + noise, float("-inf")).argmax(dim=-1)
        return choice, z.gather(1, choice[:, None])[:, 0]

    choice, chosen = draw(0, torch.full_like(top[:, 0], float("-inf")))
    pending = ~greedy & (rows.top_p < 1)
    if rows.use_top_p and pending.any():
        weight = torch.exp(z - top)  # zero outside B
        total = weight.sum(-1)
        round_ = 1
        while pending.any() and round_ < MAX_ROUNDS:
            above = (weight * (z > chosen[:, None])).sum(-1)
            pending &= above >= rows.top_p * total
            nxt, nxt_z = draw(round_, chosen)
            choice, chosen = torch.where(pending, nxt, choice), torch.where(pending, nxt_z, chosen)
            round_ += 1
    return torch.where(greedy, z.argmax(dim=-1), choice)


def sample_filtered(logits: Tensor, rows: RowSettings, mask: TokenMask | None) -> Tensor:
    """``[B]`` int64 token ids: the Triton kernel on a GPU, the torch reference elsewhere."""
    if use_triton(logits):
        from infer.kernels.sampling_triton import sample_filtered_triton

        return sample_filtered_triton(logits, rows, mask)
    return sample_filtered_torch(logits, rows, mask)
