"""The allocation strategies the simulator compares, each a cache pool built for a budget."""

from __future__ import annotations

from infer.kvsim.dynamic import FirstFitPool
from infer.kvsim.footprint import KVFootprint
from infer.kvsim.naive import NaivePool
from infer.kvsim.paged import PagedPool
from infer.kvsim.pool import SimulatedPool
from infer.kvsim.window import WindowedPool

# strategy → what it is (shown by --help and in reports)
STRATEGIES: dict[str, str] = {
    "naive": "a max_seq_len region reserved per sequence (the lab's NaiveKVCache)",
    "dynamic": "exact-size contiguous regions, first fit, grown or moved on demand",
    "paged": "blocks anywhere, on demand (the engine's BlockAllocator/PagedKVCachePool)",
    "paged+prefix": "paged, full prompt blocks shared through the prefix index (ref counts)",
    "paged+window": "paged, windowed layers release blocks wholly outside the window",
}


def parse_strategies(text: str) -> list[str]:
    """``naive,paged`` → ``["naive", "paged"]``; ``ValueError`` naming an unknown one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in STRATEGIES:
            raise ValueError(f"strategies: unknown {name!r} (known: {', '.join(STRATEGIES)})")
    if not names:
        raise ValueError("strategies: name at least one")
    return names


def build_pool(
    strategy: str,
    footprint: KVFootprint,
    memory_bytes: int,
    block_size: int,
    max_seq_len: int,
    window: int | None = None,
) -> SimulatedPool:
    """The pool of ``strategy`` holding ``memory_bytes`` of KV cache for ``footprint``.

    ``window`` (tokens) only matters to ``paged+window``; see ``KVFootprint.with_window``.
    """
    block_bytes = footprint.block_bytes(block_size)
    num_blocks = memory_bytes // block_bytes
    if num_blocks < 1:
        raise ValueError(
            f"memory: {memory_bytes} bytes hold no block of {block_size} tokens "
            f"({block_bytes} bytes)"
        )
    if strategy == "paged+window":
        return WindowedPool(footprint.with_window(window, block_size), memory_bytes, block_size)
    if strategy == "naive":
        return NaivePool(num_blocks, block_size, block_bytes, max_seq_len)
    if strategy == "dynamic":
        return FirstFitPool(num_blocks, block_size, block_bytes)
    if strategy in ("paged", "paged+prefix"):
        return PagedPool(num_blocks, block_size, block_bytes, strategy == "paged+prefix")
    raise ValueError(f"strategies: unknown {strategy!r} (known: {', '.join(STRATEGIES)})")
