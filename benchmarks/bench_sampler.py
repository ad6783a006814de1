"""The sampler alone on the GPU: one step's sampling at 256 (and 1) rows of Llama 3's
vocabulary, per setting, against the greedy argmax and the torch reference (the CPU path,
which sorts for top-k).

    python benchmarks/bench_sampler.py [--rows 256,1] [--vocab 128256]

Logits are ``randn * scale`` in ``--dtype`` (the engine samples the LM head's output as it
comes): a small scale is nearly flat (as dummy weights give),
a large one peaked (as trained models give); the flat case is the hard one for top-k and the
number of top-p rounds. Prints a table (microseconds a step, CUDA events, median of 50).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from functools import partial

import torch

from infer.kernels.sampling import RowSettings, sample_filtered, sample_filtered_torch

SETTINGS = {
    "temperature 1.0": (1.0, 0, 1.0, 0.0),
    "t 0.7, top-p 0.9": (0.7, 0, 0.9, 0.0),
    "t 1.0, top-k 50": (1.0, 50, 1.0, 0.0),
    "t 1.0, min-p 0.05": (1.0, 0, 1.0, 0.05),
    "t 0.8, k 50, p 0.95": (0.8, 50, 0.95, 0.0),
}


def _rows(count: int, vocab: int, setting: tuple[float, int, float, float]) -> RowSettings:
    temperature, top_k, top_p, min_p = setting
    cuda = torch.device("cuda")
    return RowSettings(
        temperature=torch.full((count,), temperature, device=cuda),
        top_k=torch.full((count,), top_k or vocab, dtype=torch.int64, device=cuda),
        top_p=torch.full((count,), top_p, device=cuda),
        min_p=torch.full((count,), min_p, device=cuda),
        seeds=torch.arange(count, dtype=torch.int64, device=cuda),
        steps=torch.zeros(count, dtype=torch.int64, device=cuda),
        use_top_k=top_k > 0,
        use_top_p=top_p < 1.0,
    )


def _time_us(fn: Callable[[], object], repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="256,1")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--scales", default="0.1,3")
    parser.add_argument("--dtype", default="bfloat16", help="the logits' (the model's) dtype")
    args = parser.parse_args()
    lines = [
        "| rows | logits scale | setting | kernel µs | torch reference µs |",
        "|---|---|---|---:|---:|",
    ]
    for count in (int(r) for r in args.rows.split(",")):
        for scale in (float(s) for s in args.scales.split(",")):
            torch.manual_seed(0)
            logits = torch.randn(count, args.vocab, device="cuda") * scale
            logits = logits.to(getattr(torch, args.dtype))
            greedy = _time_us(partial(logits.argmax, dim=-1))
            lines.append(f"| {count} | {scale:g} | greedy argmax | {greedy:.0f} | |")
            for name, setting in SETTINGS.items():
                rows = _rows(count, args.vocab, setting)
                kernel = _time_us(partial(sample_filtered, logits, rows, None))
                reference = _time_us(partial(sample_filtered_torch, logits, rows, None), 10)
                lines.append(f"| {count} | {scale:g} | {name} | {kernel:.0f} | {reference:.0f} |")
            print("\n".join(lines[-len(SETTINGS) - 1 :]), flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
