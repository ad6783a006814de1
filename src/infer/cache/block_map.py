"""A picture of a cache pool, block by block: what the dashboard draws.

Each block is *free*, *evictable* (free, but still holding a cached prefix that a new
request may reuse), *private* (one reference) or *shared* (several sequences' prefix); its
reference count and the sequence that holds it come along. Built with numpy from the page
tables (one pass over the blocks in use, none over the free ones), so a picture of a large
pool costs the engine's loop little (``benchmarks/dashboard_overhead.py --cpu``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from infer.contract.engine_view import (
    EVICTABLE,
    FREE,
    MAX_OWNERS,
    NO_OWNER,
    PRIVATE,
    SHARED,
    BlockMap,
)


def build_block_map(
    num_blocks: int,
    block_size: int,
    tables: Mapping[int, Sequence[int]],
    cached: bytes,
    owners: Sequence[int],
    unused_slots: int,
    evictions: int,
) -> BlockMap:
    """The map of a pool whose sequences hold ``tables`` (sequence id → blocks), with the
    prefix-cached blocks ``cached`` (a byte per block, 1 where cached; empty: none);
    ``owners``: the sequence ids the map's owner indices refer to; ``unused_slots``: token
    slots in used blocks that hold no token."""
    lengths = np.fromiter((len(t) for t in tables.values()), dtype=np.int64, count=len(tables))
    held = np.fromiter(chain.from_iterable(tables.values()), dtype=np.int64, count=lengths.sum())
    refs = np.bincount(held, minlength=num_blocks)
    kind = np.full(num_blocks, FREE, dtype=np.uint8)
    if cached:
        kind[np.frombuffer(cached, dtype=np.uint8) != 0] = EVICTABLE
    kind[refs == 1] = PRIVATE
    kind[refs > 1] = SHARED
    owner = np.full(num_blocks, NO_OWNER, dtype="<u2")
    rank = {seq_id: i for i, seq_id in enumerate(owners[:MAX_OWNERS])}
    holders = np.fromiter((rank.get(s, NO_OWNER) for s in tables), dtype="<u2", count=len(tables))
    holder_of_each = np.repeat(holders, lengths)
    listed = holder_of_each != NO_OWNER
    owner[held[listed]] = holder_of_each[listed]
    shares = listed & (refs[held] > 1)
    used = int(np.count_nonzero(refs))
    shared = int(np.count_nonzero(refs > 1))
    return BlockMap(
        num_blocks=num_blocks,
        block_size=block_size,
        kind=kind.tobytes(),
        refs=np.minimum(refs, 255).astype(np.uint8).tobytes(),
        owner=owner.tobytes(),
        share_block=held[shares].astype("<u4").tobytes(),
        share_holder=holder_of_each[shares].tobytes(),
        used_blocks=used,
        shared_blocks=shared,
        evictable_blocks=int(np.count_nonzero(kind == EVICTABLE)),
        internal_fragmentation=unused_slots / (used * block_size) if used else 0.0,
        evictions=evictions,
    )
