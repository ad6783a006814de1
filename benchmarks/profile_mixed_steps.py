"""Device time of a mixed step by graph bucket, against a decode step, kernel by kernel.

The shapes `prefix_caching` and `chunked_prefill` make: decode rows (1,200-token contexts)
beside one request whose first tokens are cached or already computed (a 1,024-token prefix,
earlier chunks) and whose N new tokens run now. Each case is loaded into the engine's own CUDA
graph runner and its graph replayed (timed with events, then profiled: the replay's kernels
by kind). Prints one JSON line per case.

Usage: python benchmarks/profile_mixed_steps.py [MODEL]   (default llama-3.2-3b, dummy weights)
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from infer import LLM
from infer.attention import ScheduledSequence

ATTENTION = ("_decode_kernel", "_prefill_kernel", "_combine_kernel")
GEMM = ("gemm", "gemv", "cutlass", "sm90", "nvjet", "xmma", "splitk")
# (decode rows, computed tokens of the request with new tokens, its new tokens)
CASES = [(7, 1024, n) for n in (9, 25, 41, 57, 73, 89, 105, 121, 128, 160, 249)]
CASES += [(7, 0, 384), (7, 768, 384), (40, 384, 384), (100, 384, 384)]


def kind(name: str) -> str:
    attention = next((kernel for kernel in ATTENTION if kernel in name), None)
    if attention is not None:
        return attention.strip("_")
    return "gemm" if any(key in name.lower() for key in GEMM) else "other"


def replay_ms(replay: Callable[[], None], repeats: int = 30) -> float:
    for _ in range(3):
        replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def kernels_ms(replay: Callable[[], None], repeats: int = 5) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            replay()
        torch.cuda.synchronize()
    by_kind: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_kind[kind(event.name)] += event.device_time / repeats / 1e3
    return {name: round(ms, 4) for name, ms in sorted(by_kind.items())}


def step(
    block_size: int, decodes: int, computed: int = 0, new_tokens: int = 0
) -> list[ScheduledSequence]:
    """``decodes`` decode rows, then (``new_tokens`` > 0) a request's next tokens."""
    rows: list[tuple[int, list[int]]] = [(1200, [100])] * decodes
    if new_tokens:
        rows.append((computed, [100] * new_tokens))
    sequences, block = [], 1
    for computed, token_ids in rows:
        blocks = -(-(computed + len(token_ids)) // block_size)
        sequences.append(ScheduledSequence(list(range(block, block + blocks)), computed, token_ids))
        block += blocks
    return sequences


@torch.inference_mode()
def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-3b"
    graphs = LLM(model, load_format="dummy").engine.runner.graphs
    assert graphs is not None, "needs CUDA graphs"
    cases = [("decode, 8 rows", step(graphs.block_size, 8))]
    cases += [
        (f"{d} decode rows + {n} new after {c}", step(graphs.block_size, d, c, n))
        for d, c, n in CASES
    ]
    for label, sequences in cases:
        bucket = graphs.bucket_for(sequences)
        assert bucket is not None
        graphs.load(bucket, sequences)
        graph, _ = graphs._graphs[bucket]
        print(json.dumps({
            "case": label, "bucket_tokens": bucket.tokens, "replay_ms": round(
                replay_ms(graph.replay), 4), "kernels_ms": kernels_ms(graph.replay),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
