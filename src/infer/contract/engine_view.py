"""What the dashboard sees of an engine (``engine/core/watch.py`` takes it): its pool block by
block, its requests and its steps since the previous picture.

The pool's picture (``BlockMap``) is built with numpy (``cache/block_map.py``); here it is
plain bytes, so a picture pickles cheaply and the API process reads it without numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

FREE, EVICTABLE, PRIVATE, SHARED = 0, 1, 2, 3
NO_OWNER = 0xFFFF  # ``owner`` of a block that no listed sequence holds
MAX_OWNERS = NO_OWNER  # sequences beyond this many are drawn without an owner


@dataclass(frozen=True)
class BlockMap:
    """Per block (little-endian arrays, as bytes so they pickle cheaply): ``kind`` (uint8,
    one of the constants above), ``refs`` (uint8 reference counts, 255 at most) and
    ``owner`` (uint16: index in the caller's list of sequences, ``NO_OWNER`` for none; a
    shared block gets one of its holders). Every holder of a shared block is in the pairs
    ``share_block`` (uint32) and ``share_holder`` (uint16, as ``owner``)."""

    num_blocks: int
    block_size: int
    kind: bytes
    refs: bytes
    owner: bytes
    share_block: bytes
    share_holder: bytes
    used_blocks: int
    shared_blocks: int
    evictable_blocks: int
    internal_fragmentation: float  # empty token slots in used blocks / their capacity
    evictions: int  # cached blocks reused for something else, ever


# (request_id, state, prompt tokens, prompt tokens found cached, computed tokens, output
#  tokens, blocks held, preemptions, max_tokens): one row per request, small to pickle.
RequestRow = tuple[str, str, int, int, int, int, int, int, int | None]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One ``Engine.step`` call that launched work: ``duration_s`` is its wall time (with
    async scheduling, the step period), ``graphed`` whether a CUDA graph ran it (None
    where nothing runs: the simulator)."""

    time_s: float  # when it ended
    duration_s: float
    prefill_tokens: int
    decode_tokens: int
    rows: int
    graphed: bool | None


@dataclass(frozen=True)
class EngineView:
    """A picture of the engine and what happened since the previous one. Block owners are
    indices into ``requests``, whose running rows come first."""

    time_s: float
    backend: str
    blocks: BlockMap
    requests: list[RequestRow]
    num_waiting: int
    chunk_size: int | None  # of chunked prefill; None: prompts run whole
    steps: list[StepRecord]
    latencies: list[tuple[float, float, float | None]]  # (time, TTFT, mean ITL) in seconds
    preempted: list[tuple[float, str]]  # (time, request id)
