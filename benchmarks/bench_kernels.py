"""Attention kernel benchmark (GPU only): Triton paged attention vs gather + SDPA and vs SDPA.

Prints one JSON line per measurement and summary tables last; writes everything to
``benchmarks/results/kernels-<date>.json`` (``--output``).

* ceiling: device-to-device copy bandwidth (2 GiB, bytes read + written).
* decode: Llama-3.2-3B heads (24 q, 8 kv, dim 128), bf16, block 16, random block tables;
  batch 1/16/64/256 x context 128/1k/4k/16k. "GPU µs" replays the calls in a CUDA graph (as
  the engine's decode graphs do) over enough copies of the batch that every call reads its
  K/V from HBM, not L2; bandwidth = K/V bytes read / GPU time. "eager µs" is one plain call
  (do_bench, L2 flushed), which also pays the host's launch cost; the speedup over gather +
  SDPA (not capturable: it synchronises) compares eager with eager.
* prefill: 4096 causal tokens (one sequence; 8 x 512) against
  ``scaled_dot_product_attention(is_causal=True)`` on contiguous inputs, both timed in graphs.
* ``--sweep``: also times alternative tiles and split counts (for tuning the defaults).

Usage: ``PYTHONPATH=src python benchmarks/bench_kernels.py [--output PATH] [--sweep]``
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from infer.attention.metadata import AttentionMetadata, ScheduledSequence, build_metadata
from infer.attention.torch_backend import paged_attention_torch
from infer.attention.triton_backend import paged_attention_triton
from infer.kernels.paged_attention import (
    TileConfig,
    decode_config,
    num_kv_splits,
    num_prefill_splits,
    prefill_config,
    prefill_rows,
)

LLAMA = (24, 8, 128)  # Llama-3.2-3B: query heads, KV heads, head_dim
GEMMA = (4, 1, 256)  # Gemma-3-1B
BLOCK = 16
BATCHES = [1, 16, 64, 256]
CONTEXTS = [128, 1024, 4096, 16384]
COLD_BYTES = 512 * 2**20  # K/V read per graph replay: well past the L2 cache
RESULTS: list[dict[str, Any]] = []

Call = Callable[[], object]


def emit(**row: Any) -> dict[str, Any]:
    print(json.dumps(row), flush=True)
    RESULTS.append(row)
    return row


def eager_ms(fn: Call) -> float:
    """Median time of one plain call (CUDA events; do_bench flushes L2 before every call)."""
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graph_ms(calls: list[Call], min_calls: int = 10) -> float:
    """GPU time per call: the calls (cycled) captured in one CUDA graph, median of replays."""
    for call in calls:
        call()  # compile and allocate outside the capture
    torch.cuda.synchronize()
    count = max(len(calls), min_calls)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(count):
            calls[i % len(calls)]()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(7):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / count)
    return statistics.median(times)


def host_us(fn: Call, calls: int = 200) -> float:
    """Host time to issue one call (the GPU work is small enough not to back up)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def copy_bandwidth() -> float:
    """TB/s of a 2 GiB device copy, counting bytes read and written."""
    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * 2**31 / (eager_ms(partial(dst.copy_, src)) / 1e3) / 1e12


def paged_batches(
    specs: list[tuple[int, int]], heads: tuple[int, int, int], copies: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[AttentionMetadata]]:
    """q, caches and ``copies`` batches ``[(context_len, query_len), ...]`` on disjoint,
    randomly permuted blocks of one pool."""
    num_heads, num_kv_heads, head_dim = heads
    needed = [math.ceil(ctx / BLOCK) for ctx, _ in specs]
    order = torch.randperm(sum(needed) * copies).tolist()
    metas, used = [], 0
    for _ in range(copies):
        seqs = []
        for (ctx, qlen), n in zip(specs, needed, strict=True):
            seqs.append(ScheduledSequence(order[used : used + n], ctx - qlen, [0] * qlen))
            used += n
        metas.append(build_metadata(seqs, BLOCK, torch.device("cuda"))[1])
    shape = (len(order), num_kv_heads, BLOCK, head_dim)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(metas[0].positions.shape[0], num_heads, head_dim, device="cuda").bfloat16()
    return q, k, v, metas


def decode_setup(
    batch: int, ctx: int
) -> tuple[list[Call], Callable[..., Call], tuple[Any, ...], int]:
    """Graph calls over cold copies, a factory for one call with options, the first copy's
    arguments and the K/V bytes per call."""
    kv_bytes = batch * ctx * LLAMA[1] * LLAMA[2] * 2 * 2
    copies = min(256, math.ceil(COLD_BYTES / kv_bytes))
    q, k, v, metas = paged_batches([(ctx, 1)] * batch, LLAMA, copies)
    scale = LLAMA[2] ** -0.5

    def call(meta: AttentionMetadata = metas[0], **options: Any) -> Call:
        return partial(paged_attention_triton, q, k, v, meta, scale, **options)

    return [call(meta) for meta in metas], call, (q, k, v, metas[0], scale), kv_bytes


def bench_decode(copy_tb_s: float) -> None:
    free = torch.cuda.mem_get_info()[0]
    for batch in BATCHES:
        for ctx in CONTEXTS:
            kv_bytes = batch * ctx * LLAMA[1] * LLAMA[2] * 2 * 2
            if 3 * kv_bytes > free:
                emit(kind="decode", batch=batch, context=ctx, skipped="does not fit")
                continue
            calls, call, inputs, kv_bytes = decode_setup(batch, ctx)
            gpu_ms = graph_ms(calls)
            ms = eager_ms(call())
            try:
                torch_ms: float | None = eager_ms(partial(paged_attention_torch, *inputs))
            except torch.cuda.OutOfMemoryError:
                torch_ms = None
            emit(
                kind="decode", batch=batch, context=ctx,
                splits=num_kv_splits(batch, LLAMA[1], ctx, torch.device("cuda")),
                gpu_us=round(gpu_ms * 1e3, 1), gb_s=round(kv_bytes / gpu_ms / 1e6, 1),
                frac_copy=round(kv_bytes / (gpu_ms / 1e3) / 1e12 / copy_tb_s, 3),
                eager_us=round(ms * 1e3, 1),
                torch_us=None if torch_ms is None else round(torch_ms * 1e3, 1),
                speedup=None if torch_ms is None else round(torch_ms / ms, 2),
            )  # fmt: skip
            del calls, call, inputs
            torch.cuda.empty_cache()


def causal_flops(lens: list[int], num_heads: int, head_dim: int) -> float:
    return sum(4 * num_heads * head_dim * n * (n + 1) / 2 for n in lens)


def prefill_call(
    lens: list[int], heads: tuple[int, int, int], window: int = 0, tile: TileConfig | None = None
) -> Call:
    q, k, v, metas = paged_batches([(n, n) for n in lens], heads)
    scale = heads[2] ** -0.5
    return partial(paged_attention_triton, q, k, v, metas[0], scale, window, prefill_tile=tile)


def bench_prefill(heads: tuple[int, int, int], window: int = 0) -> None:
    num_heads, num_kv_heads, head_dim = heads
    for lens in ([4096], [512] * 8):
        flops = causal_flops(lens, num_heads, head_dim)
        ms = graph_ms([prefill_call(lens, heads, window)])
        # SDPA's best case: contiguous [B, H, L, D] inputs with the KV heads already expanded.
        qs = torch.randn(len(lens), num_heads, lens[0], head_dim, device="cuda").bfloat16()
        ks, vs = torch.randn_like(qs), torch.randn_like(qs)
        sdpa_ms = graph_ms([partial(F.scaled_dot_product_attention, qs, ks, vs, is_causal=True)])
        emit(
            kind="prefill", heads=f"{num_heads}/{num_kv_heads}/{head_dim}",
            seqs=len(lens), tokens=sum(lens), window=window, gpu_us=round(ms * 1e3, 1),
            triton_tflops=round(flops / ms / 1e9, 1),
            sdpa_tflops=None if window else round(flops / sdpa_ms / 1e9, 1),
            ratio=None if window else round(sdpa_ms / ms, 3),
        )  # fmt: skip


def bench_host_overhead() -> None:
    """Host time to issue a decode and a mixed step's attention (what CUDA graphs remove).

    Tiny batches, so that the GPU never falls behind and the loop measures the host alone.
    """
    _, call, _, _ = decode_setup(16, 128)
    emit(kind="host", path="decode batch", us_per_call=round(host_us(call()), 1))
    q, k, v, metas = paged_batches([(64, 64), (64, 64)] + [(128, 1)] * 8, LLAMA)
    mixed = partial(paged_attention_triton, q, k, v, metas[0], LLAMA[2] ** -0.5)
    emit(kind="host", path="mixed batch", us_per_call=round(host_us(mixed), 1))


SWEPT_DECODE_SHAPES = [(1, 16384), (16, 1024), (16, 4096), (64, 4096), (256, 1024)]


def sweep_decode(shapes: list[tuple[int, int]], all_tiles: bool = False) -> None:
    """Times alternative decode tiles (for batches of 1 and 16, or every batch with
    ``all_tiles``) and split counts (graph-timed)."""
    tiles = [
        TileConfig(16, block_n, warps, stages)
        for block_n, warps, stages in itertools.product((32, 64, 128), (4, 8), (2, 3, 4))
    ]
    for batch, ctx in shapes:
        _, call, _, kv_bytes = decode_setup(batch, ctx)
        default = num_kv_splits(batch, LLAMA[1], ctx, torch.device("cuda"))
        trials = [(tile, default) for tile in tiles if all_tiles or batch in (1, 16)]
        trials += [(decode_config(LLAMA[2]), s) for s in sorted({1, 2, 4, 8, 16, 32} - {default})]
        for tile, splits in trials:
            ms = graph_ms([call(num_splits=splits, decode_tile=tile)], min_calls=20)
            emit(
                kind="sweep_decode", batch=batch, context=ctx, tile=list(vars(tile).values()),
                splits=splits, us=round(ms * 1e3, 1), gb_s=round(kv_bytes / ms / 1e6, 1),
            )  # fmt: skip
        del call
        torch.cuda.empty_cache()


def sweep() -> None:
    """Times alternative decode tiles, split counts and prefill tiles (graph-timed)."""
    sweep_decode(SWEPT_DECODE_SHAPES)
    prefill_tiles = {
        128: [(128, 128, 8, 2), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 2),
              (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 2), (128, 32, 8, 3)],
        256: [(64, 64, 8, 3), (64, 64, 4, 2), (64, 32, 4, 2), (64, 32, 8, 2), (128, 64, 8, 2),
              (32, 64, 4, 2)],
    }  # fmt: skip
    for heads, lens in [(LLAMA, [4096]), (LLAMA, [512] * 8), (GEMMA, [4096]), (GEMMA, [512] * 8)]:
        flops = causal_flops(lens, heads[0], heads[2])
        for shape in prefill_tiles[heads[2]]:
            try:
                ms = graph_ms([prefill_call(lens, heads, tile=TileConfig(*shape))])
            except triton.runtime.errors.OutOfResources as err:
                emit(kind="sweep_prefill", heads=list(heads), tile=list(shape), error=str(err))
                continue
            emit(
                kind="sweep_prefill", heads=list(heads), seqs=len(lens), tile=list(shape),
                tflops=round(flops / ms / 1e9, 1),
            )  # fmt: skip


def bench_mixed() -> None:
    """A graph bucket's mixed step: 7 decode rows beside one sequence's new tokens over a
    long context (a cached prefix, a last chunk), with the graph's bounds for the lengths
    (``max_seq_len`` 8192): prefill tiles by the pieces its keys are cut into."""
    decodes = [(600, 1)] * 7
    tiles = [(128, 128, 8, 2), (128, 32, 4, 3), (64, 64, 4, 2), (32, 64, 4, 2), (16, 64, 4, 2)]
    for ctx, new in [(1100, 9), (1100, 40), (1100, 70), (1100, 120), (1100, 250), (1100, 384)]:
        q, k, v, metas = paged_batches([(ctx, new), *decodes], LLAMA, copies=16)
        for meta in metas:
            meta.max_seq_len = 8192
        scale = LLAMA[2] ** -0.5
        splits_tried = (1, 2, 4, 8, 16, 32) if new < 64 else (1, 2, 3, 4, 6, 8)
        for shape, splits in itertools.product(tiles, splits_tried):
            tile = TileConfig(*shape)
            block_q = prefill_rows(tile, LLAMA[0] // LLAMA[1])[1]
            default = num_prefill_splits(q.shape[0], block_q, LLAMA[1], 8192, q.device)
            calls = [
                partial(paged_attention_triton, q, k, v, meta, scale, prefill_tile=tile,
                        prefill_splits=splits)
                for meta in metas
            ]  # fmt: skip
            emit(
                kind="mixed", context=ctx, new_tokens=new, tile=list(shape), splits=splits,
                default_splits=default, us=round(graph_ms(calls) * 1e3, 1),
            )  # fmt: skip


def tables() -> str:
    lines = [
        "| batch | context | splits | GPU µs | GB/s | % of copy | eager µs "
        "| gather+SDPA eager µs | speedup |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in RESULTS:
        if r["kind"] == "decode" and "skipped" not in r:
            torch_us = "OOM" if r["torch_us"] is None else r["torch_us"]
            speedup = "-" if r["speedup"] is None else f"{r['speedup']}x"
            lines.append(
                f"| {r['batch']} | {r['context']} | {r['splits']} | {r['gpu_us']} | {r['gb_s']} "
                f"| {100 * r['frac_copy']:.0f}% | {r['eager_us']} | {torch_us} | {speedup} |"
            )
    lines += [
        "",
        "| prefill (heads q/kv/dim) | seqs x tokens | window | GPU µs | Triton TFLOP/s "
        "| SDPA TFLOP/s | Triton / SDPA |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in RESULTS:
        if r["kind"] == "prefill":
            ratio = "-" if r["ratio"] is None else f"{100 * r['ratio']:.0f}%"
            lines.append(
                f"| {r['heads']} | {r['seqs']} x {r['tokens'] // r['seqs']} | {r['window']} "
                f"| {r['gpu_us']} | {r['triton_tflops']} | {r['sdpa_tflops'] or '-'} | {ratio} |"
            )
    lines += [""] + [
        f"host time to issue one call ({r['path']}): {r['us_per_call']} µs"
        for r in RESULTS
        if r["kind"] == "host"
    ]
    return "\n".join(lines)


def main() -> None:
    date = datetime.date.today().isoformat()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=f"benchmarks/results/kernels-{date}.json")
    parser.add_argument("--sweep", action="store_true", help="also time alternative tiles")
    parser.add_argument(
        "--mixed", action="store_true", help="only a mixed step's prefill tiles and key splits"
    )
    parser.add_argument(
        "--decode-sweep",
        help="only the decode tiles and splits of these BATCHxCONTEXT shapes, e.g. 16x32768",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA GPU")
    torch.manual_seed(0)
    if args.mixed:
        bench_mixed()
        return
    if args.decode_sweep:
        emit(kind="ceiling", copy_tb_s=round(copy_bandwidth(), 3))
        shapes = [tuple(map(int, shape.split("x"))) for shape in args.decode_sweep.split(",")]
        sweep_decode([(batch, ctx) for batch, ctx in shapes], all_tiles=True)
        return
    props = torch.cuda.get_device_properties(0)
    copy_tb_s = copy_bandwidth()
    emit(kind="ceiling", gpu=props.name, copy_tb_s=round(copy_tb_s, 3))
    emit(
        kind="defaults", decode_d128=list(vars(decode_config(128)).values()),
        prefill_d128=list(vars(prefill_config(128)).values()),
        prefill_d256=list(vars(prefill_config(256)).values()),
    )  # fmt: skip
    bench_decode(copy_tb_s)
    bench_prefill(LLAMA)
    bench_prefill(GEMMA)
    bench_prefill(GEMMA, window=512)
    bench_host_overhead()
    table = tables()
    record = {
        "date": date, "gpu": props.name, "torch": torch.__version__,
        "triton": triton.__version__, "copy_tb_s": round(copy_tb_s, 3), "results": RESULTS,
        "table": table,
    }  # fmt: skip
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(record, indent=1))
    if args.sweep:  # after the record is safe: tuning data goes to stdout only
        sweep()
    print(f"\n{props.name}, torch {torch.__version__}, triton {triton.__version__}, {date}")
    print(f"copy bandwidth {copy_tb_s:.2f} TB/s (read + write)\n")
    print(table)


if __name__ == "__main__":
    main()
