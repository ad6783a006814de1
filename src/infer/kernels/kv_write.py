"""Writes a step's new K/V into the paged pool by slot (``slot = block * block_size + offset``):
the torch reference (on the GPU, ``rope_kv_write_triton`` rotates and writes in one launch)."""

from __future__ import annotations

from torch import Tensor


def write_kv_torch(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    rows: Tensor | None = None,
) -> None:
    """Reference. ``k, v [T, Hkv, D]``; caches ``[N, Hkv, BS, D]``; slot ``-1`` = skip.

    ``rows`` lists the rows whose slot is not -1 when the caller knows them (finding them
    costs a GPU a synchronisation)."""
    block_size = k_cache.shape[2]
    if rows is None:
        rows = (slot_mapping >= 0).nonzero().squeeze(1)
    slots = slot_mapping[rows]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, :, offsets, :] = k[rows].to(k_cache.dtype)
    v_cache[blocks, :, offsets, :] = v[rows].to(v_cache.dtype)
