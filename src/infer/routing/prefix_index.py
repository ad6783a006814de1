"""What one worker has been sent, as the block hashes of its prompts: an approximate view
of its prefix cache, bounded in size, forgetting the least recently used blocks first."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    """At most ``capacity`` block hashes, least recently used first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1 block, got {capacity}")
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` the worker holds."""
        for count, block in enumerate(hashes):
            if block not in self._blocks:
                return count
        return len(hashes)

    def insert(self, hashes: Sequence[int]) -> None:
        """Record ``hashes`` as just used, forgetting the least recently used beyond the
        capacity.

        The last block is touched first, so a prompt's first blocks are the most recent and
        outlive its tail: a prefix is kept rather than a tail that nothing would match."""
        blocks = self._blocks
        for block in reversed(hashes):
            if block in blocks:
                blocks.move_to_end(block)
            else:
                blocks[block] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
