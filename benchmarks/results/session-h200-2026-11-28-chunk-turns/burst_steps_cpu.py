"""The scheduler alone on the CPU, over a burst workload, at two chunk sizes: how many steps
its prompts take and a crude step-time model (a weight-read floor, a cost per token padded to
the mixed CUDA graphs' 128-token sizes), to see whether the chunk size reaches a burst (it
does not where the step's token budget binds). Run from the repository root:

    PYTHONPATH=src python3 THIS_FILE burst256 serve_burst
"""

import sys

from infer.cache import PagedKVCachePool
from infer.config import EngineConfig
from infer.contract.sampling_params import SamplingParams
from infer.engine.core.request import Request
from infer.engine.core.scheduler import Scheduler
from infer.engine.core.step import Step
from infer.workloads import make_workload

FLOOR_S = 2.7e-3  # an H200's decode step at small batches (6.6)
PER_TOKEN_S = 5.0e-6  # a padded token of a large step


def padded(tokens: int) -> int:
    return 64 if tokens <= 64 else (tokens + 127) // 128 * 128


def collected(out: Step) -> Step:
    samples = len(out.chunks_that_sample())
    out.token_ids, out.logprobs = [0] * samples, [None] * samples
    return out


def simulate(workload: str, chunk: int) -> None:
    config = EngineConfig(device="cpu", use_prefix_caching=False, prefill_chunk_size=chunk)
    scheduler = Scheduler(config, PagedKVCachePool(200_000, 16, False), max_seq_len=8192)
    for i, spec in enumerate(make_workload(workload, 32_000).requests):
        params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True)
        prompt = list(spec.prompt_token_ids)
        scheduler.add_request(Request(str(i), prompt, len(prompt), params, seed=0))
    steps, clock, first = 0, 0.0, {}
    while scheduler.has_work():
        out = scheduler.schedule()
        clock += max(FLOOR_S, padded(out.num_tokens) * PER_TOKEN_S)
        steps += 1
        for c in out.chunks:
            if c.samples:
                first.setdefault(c.request.request_id, clock)
        scheduler.update(collected(out))
    ttft = sorted(first.values())
    print(
        f"{workload} chunk {chunk}: {steps} steps, model time {clock:.3f} s, TTFT p50 "
        f"{ttft[len(ttft) // 2] * 1e3:.1f} ms, p99 {ttft[int(len(ttft) * 0.99)] * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    for name in sys.argv[1:]:
        for size in (384, 256):
            simulate(name, size)
