"""Writes a step's new K/V into the paged pool by slot (``slot = block * block_size + offset``):
the torch reference (on the GPU, ``rope_kv_write_triton`` rotates and writes in one launch)."""

from __future__ import annotations

from torch import Tensor

from infer.kernels.fp8 import FP8, indexable, to_fp8


def write_kv_torch(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    rows: Tensor | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> None:
    """Reference. ``k, v [T, Hkv, D]``; caches ``[N, Hkv, BS, D]``; slot ``-1`` = skip.

    ``rows`` lists the rows whose slot is not -1 when the caller knows them (finding them
    costs a GPU a synchronisation). An FP8 cache stores ``k / k_scale`` and ``v / v_scale``
    (``kv_scales``, one per tensor)."""
    block_size = k_cache.shape[2]
    if rows is None:
        rows = (slot_mapping >= 0).nonzero().squeeze(1)
    slots = slot_mapping[rows]
    blocks, offsets = slots // block_size, slots % block_size
    for x, cache, scale in ((k, k_cache, kv_scales[0]), (v, v_cache, kv_scales[1])):
        values = to_fp8(x[rows], scale) if cache.dtype == FP8 else x[rows].to(cache.dtype)
        indexable(cache)[blocks, :, offsets, :] = indexable(values)
