"""Few-row projections (GPU only): cuBLAS (``F.linear``) against the Triton skinny kernel.

For every projection of the benchmark models (qkv, o, gate_up, down, LM head) and every row
count of a small decode batch, times ``F.linear`` and each candidate tile of
``skinny_linear_triton``. Calls are replayed from a CUDA graph, cycling over enough copies of
the weight that each call reads it from HBM (as a step's distinct layers do), so the time
includes the gaps between graph nodes. Bandwidth = weight bytes / time.

Prints one JSON line per measurement, then the best tile per row count (least total time
over all shapes) and a table of cuBLAS against that tile and against the best tile per shape.

Usage: ``PYTHONPATH=src python benchmarks/bench_skinny_linear.py [--rows 1,2,4,8,16]
[--models llama-3.2-3b,...] [--output PATH]``
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from infer.config import ModelConfig
from infer.kernels.skinny_linear_triton import SkinnyConfig, fits, skinny_linear_triton
from infer.loader.presets import preset_config

COLD_BYTES = 256 * 2**20  # weight bytes a graph cycles over: well past the 50 MB L2
CALLS = 24


def shapes(model: str) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection of ``model``."""
    raw = preset_config(model)
    assert raw is not None, model
    c = ModelConfig.from_hf_dict(raw)
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return {
        "qkv": (q + 2 * kv, c.hidden_size),
        "o": (c.hidden_size, q),
        "gate_up": (2 * c.intermediate_size, c.hidden_size),
        "down": (c.hidden_size, c.intermediate_size),
        "lm_head": (c.vocab_size, c.hidden_size),
    }


def candidates(rows: int) -> list[SkinnyConfig]:
    """Tiles worth timing at ``rows``: register products small enough not to spill."""
    found = []
    padded = 1 << (rows - 1).bit_length()
    for block_n, block_k, split, warps, dot in itertools.product(
        [4, 8, 16, 32], [64, 128, 256, 512], [1, 2, 4], [2, 4, 8], [False, True]
    ):
        if dot:
            if rows < 8 or block_n < 16 or block_k > 256:
                continue
            per_thread = (block_n * block_k + 16 * block_k) // (warps * 32)
        else:
            per_thread = padded * block_n * block_k // (warps * 32)
        if 16 <= per_thread <= 64:
            found.append(SkinnyConfig(block_n, block_k, split, warps, dot))
    return found


def _compile(job: tuple[int, SkinnyConfig]) -> None:
    rows, config = job
    k = config.block_k * config.split_k * 2
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    skinny_linear_triton(x, torch.randn(64, k, device="cuda", dtype=torch.bfloat16), config)


def precompile(row_counts: list[int], workers: int) -> None:
    """Fill Triton's cache from ``workers`` processes (one compile takes ~1 s)."""
    jobs = [(rows, config) for rows in row_counts for config in candidates(rows)]
    print(f"compiling {len(jobs)} kernels in {workers} processes", flush=True)
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_compile, jobs, chunksize=4)


def graph_us(calls: list[Callable[[], object]], count: int = CALLS) -> float:
    """GPU µs per call, ``count`` calls (cycled) replayed from one CUDA graph."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(count):
            calls[i % len(calls)]()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / count)
    return statistics.median(times)


# Best tiles of the first sweep (H100, llama-3.2-3b), for the chained step below.
CHAIN_TILES = {
    1: {
        "qkv": SkinnyConfig(4, 512, 1, 2),
        "o": SkinnyConfig(4, 512, 1, 2),
        "gate_up": SkinnyConfig(8, 512, 1, 2),
        "down": SkinnyConfig(4, 512, 2, 2),
        "lm_head": SkinnyConfig(8, 512, 1, 4),
    },
    8: {
        "qkv": SkinnyConfig(16, 256, 1, 4, True),
        "o": SkinnyConfig(32, 128, 4, 4, True),
        "gate_up": SkinnyConfig(32, 128, 1, 4, True),
        "down": SkinnyConfig(32, 128, 4, 4, True),
        "lm_head": SkinnyConfig(16, 256, 1, 4, True),
    },
}


def bench_chain(model: str) -> None:
    """A decode step's projections, every layer's own weights, one graph: cuBLAS against the
    skinny kernel, without and with programmatic dependent launch, with and without a small
    kernel (RMSNorm) between the projections."""
    from infer.kernels.rms_norm_triton import rms_norm_triton

    raw = preset_config(model)
    assert raw is not None
    layers = ModelConfig.from_hf_dict(raw).num_layers
    dims = shapes(model)
    weights = [
        {p: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for p, (n, k) in dims.items()
         if p != "lm_head"}
        for _ in range(layers)
    ]  # fmt: skip
    n, k = dims["lm_head"]
    head = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for rows, tiles in CHAIN_TILES.items():
        xs = {p: torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for p, (_, k) in dims.items()}
        norm_w = torch.ones(xs["qkv"].shape[1], device="cuda", dtype=torch.bfloat16)

        def step(impl: str, pdl: bool, norm: bool) -> None:
            for layer in weights:
                for proj, w in layer.items():
                    if norm:
                        rms_norm_triton(xs["qkv"], norm_w, 1e-5)
                    if impl == "cublas":
                        F.linear(xs[proj], w)
                    else:
                        skinny_linear_triton(xs[proj], w, tiles[proj], pdl)
            if impl == "cublas":
                F.linear(xs["lm_head"], head)
            else:
                skinny_linear_triton(xs["lm_head"], head, tiles["lm_head"], pdl)

        for impl, pdl, norm in [
            ("cublas", False, False), ("skinny", False, False), ("skinny", True, False),
            ("cublas", False, True), ("skinny", False, True), ("skinny", True, True),
        ]:  # fmt: skip
            us = graph_us([lambda: step(impl, pdl, norm)], count=1)
            print(json.dumps({"chain": model, "rows": rows, "impl": impl, "pdl": pdl,
                              "norm_between": norm, "us": us}), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--models", default="llama-3.2-3b,qwen3-4b,gemma-3-1b")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--compile-workers", type=int, default=12)
    parser.add_argument("--chain", action="store_true", help="time the chained step only")
    args = parser.parse_args()
    if args.chain:
        bench_chain("llama-3.2-3b")
        return
    row_counts = [int(r) for r in args.rows.split(",")]
    precompile(row_counts, args.compile_workers)
    results: list[dict[str, Any]] = []
    # (rows, config) -> {shape: µs}; (rows, shape) -> cuBLAS µs
    tiles: dict[tuple[int, SkinnyConfig], dict[str, float]] = defaultdict(dict)
    cublas: dict[tuple[int, str], float] = {}
    for model in args.models.split(","):
        for proj, (n, k) in shapes(model).items():
            shape = f"{model}/{proj}"
            nbytes = n * k * 2
            copies = max(1, min(16, COLD_BYTES // nbytes))
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            for rows in row_counts:
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                ref = F.linear(x, weights[0]).float()
                us = graph_us([lambda w=w: F.linear(x, w) for w in weights])
                cublas[rows, shape] = us
                row = {"shape": shape, "n": n, "k": k, "rows": rows, "impl": "cublas", "us": us}
                row["tb_s"] = nbytes / us / 1e6
                print(json.dumps(row), flush=True)
                results.append(row)
                for config in candidates(rows):
                    if not fits(x, weights[0], config):
                        continue
                    err = (skinny_linear_triton(x, weights[0], config).float() - ref).abs().max()
                    us = graph_us(
                        [lambda w=w: skinny_linear_triton(x, w, config) for w in weights]
                    )
                    tiles[rows, config][shape] = us
                    row = {"shape": shape, "rows": rows, "impl": "triton", "us": us}
                    row |= {"tb_s": nbytes / us / 1e6, "max_err": float(err)}
                    row |= {"config": config.__dict__}
                    print(json.dumps(row), flush=True)
                    results.append(row)
            del weights
            torch.cuda.empty_cache()
    print("\n| rows | shape | cuBLAS µs | best-for-rows tile µs | best tile µs | best tile |")
    print("|---:|---|---:|---:|---:|---|")
    for rows, model in itertools.product(row_counts, args.models.split(",")):
        all_shapes = sorted(shape for r, shape in cublas if r == rows and shape.startswith(model))
        complete = {
            config: {s: times[s] for s in all_shapes}
            for (r, config), times in tiles.items()
            if r == rows and all(s in times for s in all_shapes)
        }
        best_for_rows = min(complete, key=lambda c: sum(complete[c].values()))
        print(f"| {rows} | {model} | {sum(cublas[rows, s] for s in all_shapes):.1f} | "
              f"{sum(complete[best_for_rows].values()):.1f} | | {best_for_rows} |")  # fmt: skip
        for shape in all_shapes:
            per_shape = {c: t[shape] for (r, c), t in tiles.items() if r == rows and shape in t}
            best = min(per_shape, key=per_shape.__getitem__)
            print(
                f"| {rows} | {shape} | {cublas[rows, shape]:.1f} | "
                f"{complete[best_for_rows][shape]:.1f} | {per_shape[best]:.1f} | {best} |"
            )
    if args.output:
        args.output.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
