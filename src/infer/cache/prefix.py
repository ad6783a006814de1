"""Prefix cache: full blocks indexed by a hash of their tokens and of everything before them.

A block's key is ``sha256(parent_key + tokens)``, so equal keys mean equal whole prefixes
(collision-resistant, unlike Python's ``hash``). The index maps keys to block ids; blocks
stay indexed while free and are dropped from it when the allocator reuses them (eviction).

The first block's parent is its sequence's root: the same for every sequence without a
cache salt, and one of its own for each salt (``root_key``). Requests with different salts
(vLLM's ``cache_salt``: a tenant's) thus never share a block, so none can learn from the
cache what another's prompts hold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

BlockKey = bytes
_ROOT: BlockKey = b""


def root_key(cache_salt: str | None) -> BlockKey:
    """The parent of a sequence's first block: the salt's own (``_ROOT`` without one)."""
    if cache_salt is None:
        return _ROOT
    return hashlib.sha256(b"cache_salt\0" + cache_salt.encode()).digest()


def block_keys(
    token_ids: Sequence[int], block_size: int, start: int = 0, parent: BlockKey = _ROOT
) -> list[BlockKey]:
    """Keys of the full blocks of ``token_ids`` from block index ``start`` on."""
    keys: list[BlockKey] = []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for first in range(start * block_size, len(tokens) - block_size + 1, block_size):
        parent = hashlib.sha256(parent + tokens[first : first + block_size].tobytes()).digest()
        keys.append(parent)
    return keys


class PrefixIndex:
    """Key → block id for every cached full block, and the reverse."""

    def __init__(self) -> None:
        self._block_of: dict[BlockKey, int] = {}
        self._key_of: dict[int, BlockKey] = {}
        self.hits = 0
        self.queries = 0

    def lookup(self, keys: Sequence[BlockKey]) -> list[int]:
        """Blocks of the longest cached prefix of ``keys``."""
        blocks: list[int] = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        self.queries += len(keys)
        self.hits += len(blocks)
        return blocks

    def insert(self, key: BlockKey, block: int) -> bool:
        """Index ``block`` under ``key``; False if the key already has a block."""
        if key in self._block_of or block in self._key_of:
            return False
        self._block_of[key] = block
        self._key_of[block] = key
        return True

    def remove(self, block: int) -> None:
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._block_of[key]

    def __len__(self) -> int:
        return len(self._key_of)
