"""A frame: the view as JSON, block arrays deflated and base64-encoded."""

from __future__ import annotations

import base64
import json
import zlib

import numpy as np

from infer.cache import PagedKVCachePool
from infer.config import EngineConfig
from infer.contract.engine_view import EngineView
from infer.contract.sampling_params import SamplingParams
from infer.dashboard.frame import frame
from infer.engine.core.request import Request
from infer.engine.core.scheduler import Scheduler
from infer.engine.core.watch import EngineWatch


def _unpack(text: str, dtype: str) -> list[int]:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype).tolist()


def view() -> EngineView:
    """Two requests sharing two prefix blocks of 4 tokens, after one step."""
    pool = PagedKVCachePool(8, 4, use_prefix_caching=True)
    scheduler = Scheduler(EngineConfig(device="cpu"), pool, max_seq_len=64)
    watch = EngineWatch()
    prompt = list(range(9))
    for name in ("a", "b"):
        scheduler.add_request(Request(name, prompt, 9, SamplingParams(max_tokens=8), seed=0))
        out = scheduler.schedule()
        sampled = len(out.chunks_that_sample())
        out.token_ids, out.logprobs = [5] * sampled, [None] * sampled
        scheduler.update(out)
    return watch.view(scheduler)


def test_block_arrays_round_trip_and_records_are_lists() -> None:
    data = json.loads(json.dumps(frame(view())))
    assert (data["numBlocks"], data["blockSize"], data["backend"]) == (8, 4, "paged")
    assert _unpack(data["kind"], "u1") == [3, 3, 2, 2, 0, 0, 0, 0]
    assert _unpack(data["refs"], "u1") == [2, 2, 1, 1, 0, 0, 0, 0]
    assert _unpack(data["owner"], "<u2")[2:] == [0, 1, 65535, 65535, 65535, 65535]
    pairs = zip(_unpack(data["shareBlock"], "<u4"), _unpack(data["shareHolder"], "<u2"))
    assert sorted(pairs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r[:2] for r in data["requests"]] == [["a", "running"], ["b", "running"]]
    assert data["requests"][1][3] == 8  # b found a's two full blocks cached
    assert (data["used"], data["shared"], data["evictable"]) == (4, 2, 0)
    assert data["steps"] == [] and data["latencies"] == [] and data["preempted"] == []
