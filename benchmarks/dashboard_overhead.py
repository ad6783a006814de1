"""What an open dashboard costs the engine (issue 39: at most 1 % of a burst's throughput).

    python benchmarks/dashboard_overhead.py --cpu                 # one picture's host cost
    python benchmarks/dashboard_overhead.py [--repeats 3] [-- SERVE FLAGS]   # on a GPU

``--cpu``: the engine-side cost of one dashboard view (``EngineWatch.view``: the pool's block
map, the request rows), with ``--cached-share`` of the blocks holding cached prefixes (a
long-served pool), and the API-side cost of its frame (deflate, base64, JSON), for a pool
of ``--blocks`` blocks holding ``--requests`` decoding requests, on the engine's own
scheduler and pool (element-less K/V tensors); plus a step's recording while watched.

Default: ``infer serve`` (a 3B model, dummy weights, unless flags follow ``--``) serves
the ``burst256`` workload alternately with the dashboard's stream closed and open (a client
in a process of its own reads it as the page does, five frames a second), ``--repeats``
times each in ABBA order; prints each run's output throughput and the loss with the
dashboard open (means and medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import httpx

from infer.bench.http_client import run_serving
from infer.bench.metrics import summarize
from infer.cache import PagedKVCachePool
from infer.config import EngineConfig, ModelConfig
from infer.contract.sampling_params import SamplingParams
from infer.dashboard.frame import frame
from infer.engine.core.request import Request
from infer.engine.core.scheduler import Scheduler
from infer.engine.core.watch import EngineWatch
from infer.loader import resolve_model
from infer.server.bridge.launch import spawn_server
from infer.workloads import make_workload

SERVE = ["--model", "llama-3.2-3b", "--load-format", "dummy"]
READER_START_S = 120.0


def _timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_cost(
    num_blocks: int, num_requests: int, repeats: int, cached_share: float
) -> dict[str, Any]:
    """Host cost of a view, its frame and a watched step's recording (milliseconds), in a
    pool where ``cached_share`` of the blocks hold cached prefixes (a long-served pool)."""
    pool = PagedKVCachePool(num_blocks, 16, use_prefix_caching=True)
    for block in range(int(cached_share * num_blocks)):
        pool.allocator.mark_cached(block)
    config = EngineConfig(device="cpu", max_batch_size=num_requests, admission_reserve=0.0)
    scheduler = Scheduler(config, pool, max_seq_len=4096)
    rng = random.Random(0)
    shared = [rng.randrange(50_000) for _ in range(64)]  # a system prompt every request has
    for i in range(num_requests):
        prompt = shared + [rng.randrange(50_000) for _ in range(rng.randint(64, 320))]
        params = SamplingParams(max_tokens=4096, ignore_eos=True, detokenize=False)
        scheduler.add_request(Request(str(i), prompt, len(prompt), params, seed=0))
    watch = EngineWatch()
    last = None
    for _ in range(20):  # prefills, then decodes: every request running
        last = scheduler.schedule()
        sampled = sum(c.samples for c in last.chunks)
        last.token_ids, last.logprobs = [1] * sampled, [None] * sampled
        scheduler.update(last)
    assert last is not None and len(scheduler.running) == num_requests
    view = watch.view(scheduler)

    def record() -> None:
        watch.begin()
        watch.launched(last, True)
        watch.stepped()

    view_s = _timed(lambda: watch.view(scheduler), repeats)
    frame_s = _timed(lambda: json.dumps(frame(view)), repeats)
    return {
        "blocks": num_blocks,
        "used_blocks": view.blocks.used_blocks,
        "shared_blocks": view.blocks.shared_blocks,
        "requests": num_requests,
        "view_ms (engine, between steps)": round(1000 * view_s, 3),
        "frame_ms (API process)": round(1000 * frame_s, 3),
        "frame_kib": round(len(json.dumps(frame(view))) / 1024, 1),
        "record_step_us (engine, per step)": round(1e6 * _timed(record, repeats * 10), 2),
    }


@contextmanager
def dashboard_open(url: str) -> Iterator[list[int]]:
    """A client reading ``/dashboard/stream`` as the page does, in a process of its own (as
    a browser is: a reader thread in the load generator took its event loop's time and
    cost the burst 3-4 %, ``results-by-topic/10-host-overheads.md``, 10.3); yields its frame
    count, known once it ends."""
    reader = subprocess.Popen(
        [sys.executable, __file__, "--read-dashboard", url],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    frames = [0]
    try:
        assert reader.stdout is not None
        # Its first frame, before the burst starts (the reader imports this module first).
        if not select.select([reader.stdout], [], [], READER_START_S)[0]:
            raise RuntimeError(f"the dashboard reader read no frame in {READER_START_S:.0f} s")
        reader.stdout.readline()
        yield frames
    finally:
        reader.terminate()
        out, _ = reader.communicate(timeout=10)
        counts = out.split()
        frames[0] = int(counts[-1]) if counts else 0


def read_dashboard(url: str) -> None:
    """Read frames until terminated, printing the count so far after each."""
    frames = 0
    with httpx.stream("GET", f"{url}/dashboard/stream", timeout=None) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                json.loads(line[5:])
                frames += 1
                print(frames, flush=True)


def served(serve_flags: list[str], repeats: int, num_requests: int) -> list[dict[str, Any]]:
    """burst256, dashboard closed and open in turn (ABBA: neither side always goes first),
    after one untimed burst; each run on prompts of its own, so no run finds another's
    prefix cached. Each run's output tokens per second."""
    runs = []
    model = serve_flags[serve_flags.index("--model") + 1]
    vocab = ModelConfig.from_hf_dict(resolve_model(model).hf_config).vocab_size
    order = [open_ for r in range(repeats) for open_ in ((True, False) if r % 2 else (False, True))]
    with spawn_server(serve_flags) as server:
        warmup = make_workload("burst256", vocab, num_requests, seed=1000)
        asyncio.run(run_serving(server.url, warmup, progress=False))
        for seed, open_ in enumerate(order, start=1):
            workload = make_workload("burst256", vocab, num_requests, seed=seed)
            with dashboard_open(server.url) if open_ else nullcontext([0]) as frames:
                _, result = asyncio.run(run_serving(server.url, workload, progress=False))
            summary = summarize(result)
            runs.append({"dashboard": open_, "frames": frames[0],
                         "output_tok_s": summary["output_tok_s"],
                         "failed": summary["num_failed"]})  # fmt: skip
            print(json.dumps(runs[-1]), flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="measure one view's host cost")
    parser.add_argument("--read-dashboard", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, default=32768, help="pool blocks (--cpu)")
    parser.add_argument("--requests", type=int, default=256, help="decoding requests (--cpu)")
    parser.add_argument(
        "--cached-share", type=float, default=0.9, help="share of blocks cached (--cpu)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=256, help="of burst256")
    parser.add_argument("serve", nargs="*", help="infer serve flags, after --")
    args = parser.parse_args()
    if args.read_dashboard:
        read_dashboard(args.read_dashboard)
        return
    if args.cpu:
        cost = cpu_cost(args.blocks, args.requests, max(args.repeats, 20), args.cached_share)
        print(json.dumps(cost, indent=2))
        return
    runs = served(args.serve or SERVE, args.repeats, args.num_requests)
    summary = {}
    for name, average in (("mean", statistics.mean), ("median", statistics.median)):
        closed = average(r["output_tok_s"] for r in runs if not r["dashboard"])
        opened = average(r["output_tok_s"] for r in runs if r["dashboard"])
        summary[name] = {"closed_tok_s": round(closed), "open_tok_s": round(opened),
                         "loss_pct": round(100 * (1 - opened / closed), 2)}  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
