"""Where one decode step's time goes: wall time per step, GPU time of the captured graph,
and the host-side Python profile. Usage (GPU): python benchmarks/profile_step.py MODEL BATCH"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from infer import LLM, SamplingParams


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-3b"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    llm = LLM(model, load_format="dummy", max_batch_size=max(batch, 1))
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True, detokenize=False)
    generator = torch.Generator().manual_seed(0)
    for _ in range(batch):
        engine.add_request(torch.randint(1000, 20000, (256,), generator=generator).tolist(), params)
    timeline = []
    while engine.scheduler.waiting or any(
        engine.scheduler.num_computed(r) < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        torch.cuda.synchronize()
        begin_step = time.perf_counter()
        scheduled_before = engine.num_prompt_tokens
        engine.step()
        torch.cuda.synchronize()
        timeline.append(
            (
                engine.num_prompt_tokens - scheduled_before,
                engine.num_running,
                time.perf_counter() - begin_step,
            )
        )
    for tokens, running, seconds in timeline:
        print(f"prefill step: {tokens} prompt tokens, {running} running, {seconds * 1e3:.1f} ms")
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        engine.step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / 20
    graphs = engine.runner.graphs
    gpu = float("nan")
    if graphs is not None:
        rows = next(b for b in graphs.buckets if b >= batch)
        graph, _ = graphs._graphs[rows]
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        gpu = begin.elapsed_time(end) / 20 / 1e3
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        engine.step()
    profiler.disable()
    print(f"{model} batch {batch}: wall {wall * 1e3:.2f} ms/step, graph replay {gpu * 1e3:.2f} ms")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
