"""Where a step's time goes (GPU): a decode step of BATCH rows and a mixed step (one 512-token
prompt chunk beside them), each eager and replayed from its CUDA graph.

For each: wall time per step, GPU time of the replay, the eager forward's kernels grouped by
kind (the replay runs the same kernels; what it saves is host time and launch gaps), and the
host-side Python profile of the eager step.

Usage: python benchmarks/profile_step.py [MODEL] [BATCH]   (default llama-3.2-3b, 256)
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from infer import LLM, SamplingParams
from infer.engine.core.engine import Engine

KINDS = (
    ("attention", ("_decode_kernel", "_prefill_kernel", "_combine_kernel")),
    ("gemm", ("gemm", "gemv", "cutlass", "sm90", "xmma", "ampere", "splitK")),
    ("norm/rope/act/kv", ("rms", "rope", "silu", "gelu", "kv", "_norm")),
)


def _kind(name: str) -> str:
    lowered = name.lower()
    return next((k for k, keys in KINDS if any(key.lower() in lowered for key in keys)), "other")


def _timed(step: Callable[[], object], repeats: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def _kernels(step: Callable[[], object]) -> None:
    """GPU time per kernel kind of one step, and the five costliest kernels."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_kind[_kind(event.name)] += event.device_time
            by_name[event.name] += event.device_time
    total = sum(by_kind.values())
    print(f"  kernels: {total / 1e3:.2f} ms of GPU time in all", flush=True)
    for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"    {kind:18s} {us / 1e3:7.3f} ms  {100 * us / total:5.1f} %")
    for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:5]:
        print(f"    {us / 1e3:7.3f} ms  {name[:90]}")


def _host_profile(step: Callable[[], object]) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    step()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def _report(label: str, engine: Engine, step: Callable[[], object]) -> None:
    """``step`` runs one step of the shape under study and restores the state it found."""
    graphs = engine.runner.graphs
    replayed = _timed(step, 10)
    engine.runner.graphs = None
    try:
        eager = _timed(step, 5)
        print(f"{label}: {replayed * 1e3:.2f} ms/step replayed, {eager * 1e3:.2f} eager")
        _kernels(step)
        _host_profile(step)
    finally:
        engine.runner.graphs = graphs


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-3b"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    # Synchronous steps: each call runs the step it schedules (none is launched ahead).
    llm = LLM(model, load_format="dummy", max_batch_size=batch + 1, use_async_scheduling=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=3000, ignore_eos=True, detokenize=False)
    generator = torch.Generator().manual_seed(0)
    for _ in range(batch):
        engine.add_request(torch.randint(1000, 20000, (256,), generator=generator).tolist(), params)
    while engine.scheduler.waiting or any(
        engine.scheduler.num_computed(r) < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    for _ in range(5):
        engine.step()
    # A decode step: every running row, one token.
    _report(f"{model} decode, batch {batch}", engine, engine.step)

    # A mixed step: one 512-token chunk of a new prompt beside the decode rows; the request
    # is aborted after its first chunk, so every repeat runs the same shape.
    def mixed_step() -> None:
        engine.add_request(torch.randint(1000, 20000, (1024,)).tolist(), params, "chunk")
        engine.step()
        engine.abort("chunk")
        engine.step()

    _report(f"{model} mixed (512-token chunk + {batch} decodes) + a decode", engine, mixed_step)


if __name__ == "__main__":
    main()
