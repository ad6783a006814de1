"""The dashboard's wire format: one ``EngineView`` as a JSON object (a *frame*).

Per-block arrays travel deflated and base64-encoded (a pool's map is mostly runs, so a
frame of 30 000 blocks is a few kilobytes); the page inflates them with the browser's
``DecompressionStream``. Members, in seconds and tokens unless named otherwise:

- ``t``, ``backend``, ``numBlocks``, ``blockSize``; ``kind`` (uint8: 0 free, 1 evictable,
  2 private, 3 shared), ``refs`` (uint8), ``owner`` (uint16 LE, index into ``requests``,
  65535 for none); ``shareBlock`` (uint32 LE) and ``shareHolder`` (uint16 LE): every
  (block, holder) pair of the shared blocks; ``used``, ``shared``, ``evictable``,
  ``fragmentation``, ``evictions``;
- ``requests``: rows ``[id, state, prompt, cached, computed, output, blocks, preemptions,
  max_tokens]``, running first; ``waiting``: the queue's length; ``chunkSize``: the
  prefill chunk (null: prompts run whole);
- since the previous frame: ``steps`` ``[t, ms, prefill, decode, rows, graphed]``,
  ``latencies`` ``[t, ttft, itl]``, ``preempted`` ``[t, request id]``.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

from infer.contract.engine_view import EngineView


def frame(view: EngineView) -> dict[str, Any]:
    """The JSON-ready frame of ``view``."""
    blocks = view.blocks
    return {
        "t": round(view.time_s, 4),
        "backend": view.backend,
        "numBlocks": blocks.num_blocks,
        "blockSize": blocks.block_size,
        "kind": _pack(blocks.kind),
        "refs": _pack(blocks.refs),
        "owner": _pack(blocks.owner),
        "shareBlock": _pack(blocks.share_block),
        "shareHolder": _pack(blocks.share_holder),
        "used": blocks.used_blocks,
        "shared": blocks.shared_blocks,
        "evictable": blocks.evictable_blocks,
        "fragmentation": round(blocks.internal_fragmentation, 4),
        "evictions": blocks.evictions,
        "requests": view.requests,
        "waiting": view.num_waiting,
        "chunkSize": view.chunk_size,
        "steps": [
            [
                round(s.time_s, 4),
                round(s.duration_s * 1000, 3),
                s.prefill_tokens,
                s.decode_tokens,
                s.rows,
                s.graphed,
            ]
            for s in view.steps
        ],
        "latencies": [
            [round(t, 4), round(ttft, 6), None if itl is None else round(itl, 6)]
            for t, ttft, itl in view.latencies
        ],
        "preempted": [[round(t, 4), request_id] for t, request_id in view.preempted],
    }


def _pack(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 1)).decode("ascii")
