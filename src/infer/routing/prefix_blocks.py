"""A prompt as a chain of block hashes, the unit in which workers' caches are compared.

Token ids are cut into blocks of ``tokens_per_block`` (the KV cache's block size), text into
blocks of ``chars_per_block`` characters (a router tokenizes nothing). Each block's hash
covers its parent's, so two prompts share the hash of block ``i`` only if they agree on all
of blocks ``0..i``, as the engine's prefix cache does. A partial last block is left out: the
engine caches only full blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

# What a prompt is routed by: its token ids when known, else its text.
RoutingKey = Sequence[int] | str

_ROOT = 0x9E3779B97F4A7C15  # the hash chain's seed; any constant does


def block_hashes(key: RoutingKey, tokens_per_block: int, chars_per_block: int) -> list[int]:
    """The chained hashes of ``key``'s full blocks, first block first.

    Python's ``hash`` is salted per process, which is fine: the hashes never leave it."""
    if isinstance(key, str):
        size = chars_per_block
        pieces: list[object] = [key[i : i + size] for i in range(0, len(key) - size + 1, size)]
    else:
        size = tokens_per_block
        pieces = [tuple(key[i : i + size]) for i in range(0, len(key) - size + 1, size)]
    hashes = []
    parent = _ROOT
    for piece in pieces:
        parent = hash((parent, piece))
        hashes.append(parent)
    return hashes
