"""What the scheduler, runner and engine may ask of a KV cache's block bookkeeping.

Both backends satisfy this protocol, so nothing outside ``cache/`` branches on the type of
cache (no ``isinstance``). It holds no tensors: the runner owns the K/V storage
(``kv_tensors.KVTensors``) and turns a sequence's page table and computed length into the
step's flat ``AttentionMetadata``; the copies copy-on-write needs are a list it executes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from infer.cache.stats import CacheStats
from infer.contract.engine_view import BlockMap


@runtime_checkable
class CachePoolProtocol(Protocol):
    """Allocation, growth, sharing and accounting of sequences' cache space."""

    block_size: int
    num_blocks: int
    backend: str  # its kind, as reports name it: "paged", "contiguous", a simulated strategy

    def is_paged(self) -> bool:
        """True when blocks are handed out on demand rather than reserved per slot."""
        ...

    def allocate_sequence(
        self,
        initial_tokens: int = 0,
        token_ids: Sequence[int] = (),
        known_keys: list[bytes] | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        """Start a sequence with room for ``initial_tokens``; returns its id, or None when
        the pool cannot hold it (no partial state is left behind).

        With prefix caching, ``token_ids`` (the prompt) is matched against cached blocks
        and ``get_seq_len`` of the new sequence says how many tokens need no computing.
        ``known_keys`` is the caller's list of the tokens' block keys: the pool extends it
        as blocks fill, so a preempted sequence that starts again is not hashed again.
        Only sequences with the same ``cache_salt`` share blocks (``prefix.root_key``).
        """
        ...

    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence's blocks (cached ones stay reusable). ``KeyError`` if unknown."""
        ...

    def get_seq_len(self, seq_id: int) -> int:
        """Tokens of the sequence whose K/V is in the cache."""
        ...

    def block_table(self, seq_id: int) -> list[int]:
        """Physical blocks of the sequence, in logical order."""
        ...

    def prepare_append(self, seq_id: int, num_tokens: int) -> bool:
        """Make the next ``num_tokens`` positions writable (new blocks, copy-on-write of
        shared ones). False, changing nothing, when there are not enough free blocks."""
        ...

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies copy-on-write asked for since the last
        call, for the runner to make before the next step writes the cache."""
        ...

    def advance(self, seq_id: int, num_tokens: int) -> None:
        """Record that ``num_tokens`` more are computed (their K/V is being written)."""
        ...

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` computed positions (rejected proposals): later
        steps overwrite their K/V; blocks wholly past the new end may be freed."""
        ...

    def index_blocks(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """Offer the sequence's newly completed blocks of known tokens (``token_ids``) for
        prefix sharing (a verify step's cache may run ahead of them)."""
        ...

    def used_blocks(self) -> int:
        """Blocks referenced by sequences (reserved ones included for contiguous slots)."""
        ...

    def free_token_capacity(self) -> int | None:
        """Tokens that fit in free blocks; None where capacity is per slot (contiguous)."""
        ...

    def audit_blocks(self) -> list[int]:
        """Blocks that are allocated but referenced by no sequence (leaks)."""
        ...

    def reclaim_leaked_blocks(self) -> int:
        """Free every leaked block; returns how many."""
        ...

    def stats(self) -> CacheStats:
        """Utilisation, fragmentation, allocation rates, evictions, prefix hits, leaks."""
        ...

    def block_map(self, owners: Sequence[int]) -> BlockMap:
        """Each block's state (the dashboard's picture); owner indices refer to ``owners``,
        a list of sequence ids."""
        ...
