"""GPU probe for issue 49: FP8 projections at llama-3.2-3b's shapes, and where one FP8 decode
step's time goes.

Part ``linear``: for each projection shape and row count M, the time of one call, replayed
from a CUDA graph over weight copies that together exceed L2 (so every call reads its weight
from HBM): bf16 ``F.linear``; ``_scaled_mm`` row-wise after the eager per-token quantisation
(the code before issue 49) and after the fused Triton one; the fused quantisation alone;
``_scaled_mm`` alone; the Triton W8A16 kernel at several tiles. Each W8A16 tile is checked
against the dequantised reference once.

Part ``pdl``: 28 layers of a decode step's kernels at 1 and 8 rows (norm, qkv, a small
kernel in attention's place, o, norm, gate_up, activation, down) in one CUDA graph, launched
with and without programmatic dependent launch (``INFER_DISABLE_PDL``); each output is
checked against the one launched without it (a race would differ).

Part ``profile``: one decode step of batch 1 (CUDA graphs), bf16 and FP8 weights: ms a step
and the replay's kernels by kind (``benchmarks/profile_decode_step.py``).

    PYTHONPATH=src python benchmarks/fp8_probe.py --out $OUT/fp8 [--parts linear,pdl,profile]
        [--quick]   (CPU: TRITON_INTERPRET=1, tiny shapes, no timings worth reading)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from infer.engine.core.cuda_graphs import replay_ms
from infer.kernels.activation_triton import silu_and_mul_triton
from infer.kernels.fp8_linear_triton import (
    W8A16Tile,
    quantize_rows_triton,
    w8a16_linear_triton,
    w8a16_tile,
)
from infer.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton
from infer.models.fp8 import dequantize_rows, quantize_rows

SHAPES = {"qkv": (3072, 5120), "o": (3072, 3072), "gate_up": (3072, 16384), "down": (8192, 3072)}
ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]
L2_BYTES = 256 << 20  # weights per graph: several times an H100's L2


def tiles_for(m: int) -> list[W8A16Tile]:
    """The W8A16 tiles worth timing at ``m`` rows (CUDA-core sums up to 8 rows, dots above)."""
    gemv = {
        1: [
            W8A16Tile(1, 4, 512, 4),
            W8A16Tile(1, 8, 256, 4),
            W8A16Tile(1, 16, 256, 8),
            W8A16Tile(1, 8, 512, 8),
            W8A16Tile(1, 8, 256, 4, split_k=2),
        ],
        2: [W8A16Tile(2, 4, 512, 4), W8A16Tile(2, 8, 256, 4)],
        4: [W8A16Tile(4, 4, 256, 4), W8A16Tile(4, 8, 256, 8)],
        8: [W8A16Tile(8, 4, 256, 4), W8A16Tile(8, 8, 128, 4)],
    }.get(m, [])
    if m <= 16:
        dots = [W8A16Tile(16, 32, 256, 4, 4), W8A16Tile(16, 64, 128, 4, 4)]
    elif m <= 64:
        dots = [W8A16Tile(16, 64, 128, 4, 4), W8A16Tile(32, 64, 128, 4, 4)]
        dots += [W8A16Tile(64, 64, 128, 4, 3)] if m == 64 else []
    elif m <= 256:
        dots = [W8A16Tile(64, 64, 128, 4, 3), W8A16Tile(64, 128, 128, 8, 3)]
        dots += [W8A16Tile(128, 128, 128, 8, 3)] if m == 256 else []
    else:
        dots = [W8A16Tile(128, 128, 128, 8, 3)] if m == 1024 else []
    return gemv + dots


# (block_n, block_k, num_warps[, num_stages, split_k]) of the one- and two-row sums tried
# fmt: off
SUM_SHAPES: list[tuple[int, ...]] = [
    (4, 512, 4), (8, 256, 4), (4, 1024, 4), (8, 512, 4), (8, 1024, 4), (16, 512, 4),
    (2, 1024, 2), (4, 512, 2),
    # more bytes in flight a program, and split K for the narrow weights' few programs
    (16, 1024, 8), (32, 512, 8), (8, 2048, 8), (4, 512, 4, 2, 2), (8, 256, 4, 2, 4),
    (16, 512, 8, 2, 2),
    # 11.6's best (8 x 1,024) and its neighbours: more warps, wider steps, fewer rows
    (8, 1024, 8), (16, 1024, 4), (4, 2048, 4), (8, 2048, 4), (4, 1024, 2), (2, 2048, 2),
]
# fmt: on


def explore_tiles_for(m: int) -> list[W8A16Tile]:
    """More W8A16 tiles at few rows: bytes in flight a step, programs, pipeline stages,
    split K."""
    dots = [
        W8A16Tile(16, 32, 256, 4, 4),
        W8A16Tile(16, 16, 256, 4, 4),
        W8A16Tile(16, 16, 512, 4, 3),
        W8A16Tile(16, 32, 512, 4, 3),
        W8A16Tile(16, 32, 128, 4, 6),
        W8A16Tile(16, 16, 128, 4, 8),
        W8A16Tile(16, 32, 256, 4, 4, split_k=2),
    ]
    if m == 1:  # `single` runs here: wider dots for the 16,384-output weight
        dots += [
            W8A16Tile(16, 64, 256, 4, 4),
            W8A16Tile(16, 64, 128, 4, 6),
            W8A16Tile(16, 32, 512, 8, 3),
            W8A16Tile(16, 128, 128, 8, 4),
        ]
    if m > 2:
        return dots
    sums = [W8A16Tile(m, *shape) for shape in SUM_SHAPES]
    return sums if m == 2 else sums + dots


TILES: dict[str, W8A16Tile] = {}  # every tile timed, by its method's name


def tile_name(tile: W8A16Tile) -> str:
    fields = [tile.block_m, tile.block_n, tile.block_k, tile.num_warps, tile.num_stages]
    name = "w8a16 " + ",".join(str(v) for v in [*fields, tile.split_k])
    TILES[name] = tile
    return name


def eager_quant_scaled_mm(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The FP8 linear before issue 49: eager per-token quantisation, then ``_scaled_mm``."""
    x_q, x_s = quantize_rows(x)
    return scaled_mm(x_q, x_s, w, s)


def fused_quant_scaled_mm(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    x_q, x_s = quantize_rows_triton(x)
    return scaled_mm(x_q, x_s, w, s)


def scaled_mm(
    x_q: torch.Tensor, x_s: torch.Tensor, w: torch.Tensor, s: torch.Tensor
) -> torch.Tensor:
    return torch._scaled_mm(
        x_q, w.t(), scale_a=x_s[:, None], scale_b=s[None, :], out_dtype=torch.bfloat16
    )


Method = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], object]


def tile_methods(x: torch.Tensor, quick: bool) -> dict[str, Method]:
    """Probe 2: bf16 and the W8A16 tiles of ``explore_tiles_for``."""
    methods: dict[str, Method] = {"bf16": lambda x, w, q, s: F.linear(x, w)}
    for tile in explore_tiles_for(x.shape[0]):
        methods[tile_name(tile)] = lambda x, w, q, s, tile=tile: w8a16_linear_triton(x, q, s, tile)
    return methods


def linear_methods(x: torch.Tensor, quick: bool) -> dict[str, Method]:
    """What to time at ``x``'s row count: each takes ``(x, bf16 weight, FP8 weight, scales)``."""
    methods: dict[str, Method] = {
        "bf16": lambda x, w, q, s: F.linear(x, w),
        "fused_quant": lambda x, w, q, s: quantize_rows_triton(x),
    }
    if not quick:  # no _scaled_mm on the CPU
        x_q, x_s = quantize_rows_triton(x)
        methods["scaled_mm+eager_quant"] = lambda x, w, q, s: eager_quant_scaled_mm(x, q, s)
        methods["scaled_mm+fused_quant"] = lambda x, w, q, s: fused_quant_scaled_mm(x, q, s)
        methods["scaled_mm_only"] = lambda x, w, q, s: scaled_mm(x_q, x_s, q, s)
    for tile in tiles_for(x.shape[0]):
        methods[tile_name(tile)] = lambda x, w, q, s, tile=tile: w8a16_linear_triton(x, q, s, tile)
    return methods


def time_graph(calls: list[Callable[[], object]], repeats: int, quick: bool) -> float:
    """Microseconds a call, each of ``calls`` once per replay of one CUDA graph."""
    if quick:  # CPU: run once, time nothing
        for call in calls:
            call()
        return float("nan")
    for call in calls:  # compile, and warm cuBLAS's heuristics
        call()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return replay_ms(graph, repeats) * 1e3 / len(calls)


def probe_linear(
    out: Path,
    quick: bool,
    budget_s: float,
    rows: list[int],
    methods_for: Callable[[torch.Tensor, bool], dict[str, Method]],
    label: str,
) -> list[dict[str, Any]]:
    """Times ``methods_for(x)`` at each shape and row count; writes ``{label}.json/.md``."""
    device = torch.device("cpu" if quick else "cuda")
    shapes = {"tiny": (1024, 64)} if quick else SHAPES
    rows = [m for m in rows if m <= 32] if quick else rows
    records: list[dict[str, Any]] = []
    started = time.monotonic()
    for index, (shape_name, (k, n)) in enumerate(shapes.items()):
        deadline = started + budget_s * (index + 1) / len(shapes)  # a share for each shape
        copies = 1 if quick else max(2, math.ceil(L2_BYTES / (n * k)))
        gen = torch.Generator(device=device).manual_seed(0)
        weights = []
        for _ in range(copies):
            w = torch.randn(n, k, generator=gen, device=device, dtype=torch.bfloat16) * 0.02
            q, s = quantize_rows(w)
            weights.append((w, q, s))
        print(f"{shape_name}: K={k} N={n}, {copies} weight copies", flush=True)
        for m in rows:
            if time.monotonic() > deadline:
                print(f"{shape_name}: out of time, next shape", flush=True)
                break
            x = torch.randn(m, k, generator=gen, device=device, dtype=torch.bfloat16)
            # Every method of this M over the same inputs; fewer repeats for big M.
            repeats = 3 if quick else max(3, min(50, 20000 // m))
            methods = methods_for(x, quick)
            reference = x.float() @ dequantize_rows(weights[0][1], weights[0][2]).T
            for name, method in methods.items():
                record = {"shape": shape_name, "k": k, "n": n, "m": m, "method": name}
                try:
                    if name in TILES:
                        record["tile"] = dataclasses.asdict(TILES[name])
                        got = method(x, *weights[0]).float()  # type: ignore[union-attr]
                        err = (got - reference).abs().max() / reference.abs().max()
                        record["max_rel_err"] = float(err)
                    calls = [functools.partial(method, x, *wt) for wt in weights]
                    record["us"] = time_graph(calls, repeats, quick)
                except Exception as error:  # one failing method must not lose the others
                    record["error"] = f"{type(error).__name__}: {error}"[:400]
                    traceback.print_exc()
                records.append(record)
            line = " ".join(
                f"{r['method'].replace('w8a16 ', 'w:')}={r.get('us', float('nan')):.1f}"
                for r in records
                if r["shape"] == shape_name and r["m"] == m
            )
            print(f"  M={m}: {line}", flush=True)
            (out / f"{label}.json").write_text(json.dumps(records, indent=1) + "\n")
    print(best_table(records), flush=True)
    (out / f"{label}.md").write_text(best_table(records) + "\n")
    return records


def best_tiles(records: list[dict[str, Any]], m: int) -> dict[str, W8A16Tile]:
    """The fastest W8A16 tile of each shape at ``m`` rows."""
    best: dict[str, tuple[float, W8A16Tile]] = {}
    for r in records:
        faster = r["shape"] not in best or r.get("us", 0) < best[r["shape"]][0]
        if r["m"] == m and "us" in r and "tile" in r and faster:
            best[r["shape"]] = (r["us"], W8A16Tile(**r["tile"]))
    return {shape: tile for shape, (_, tile) in best.items()}


# (shape name, bf16 weight, FP8 weight, its row scales)
LayerWeight = tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]


def layer_weights(
    layers: int, shapes: dict[str, tuple[int, int]], gen: torch.Generator
) -> list[LayerWeight]:
    """Each layer's own random weight of every shape, in bf16 and FP8."""
    weights = []
    for _ in range(layers):
        for name, (k, n) in shapes.items():
            w = torch.randn(n, k, generator=gen, device=gen.device, dtype=torch.bfloat16) * 0.02
            weights.append((name, w, *quantize_rows(w)))
    return weights


def probe_chain(out: Path, tiles: dict[str, W8A16Tile], m: int, quick: bool) -> None:
    """A step's projections at ``m`` rows, as a decode step runs them: 28 layers' own
    weights, qkv → o → gate_up → down, in one CUDA graph: bf16 against W8A16 at the best
    tile of each shape and at ``w8a16_tile``'s choice."""
    device = torch.device("cpu" if quick else "cuda")
    layers = 2 if quick else 28
    shapes = {"tiny": (1024, 64)} if quick else SHAPES
    gen = torch.Generator(device=device).manual_seed(1)
    weights = layer_weights(layers, shapes, gen)
    inputs = {
        k: torch.randn(m, k, generator=gen, device=device, dtype=torch.bfloat16)
        for k, _ in shapes.values()
    }
    chains: dict[str, list[Callable[[], object]]] = {
        "bf16": [functools.partial(F.linear, inputs[w.shape[1]], w) for _, w, _, _ in weights],
        "w8a16 default": [
            functools.partial(
                w8a16_linear_triton, inputs[q.shape[1]], q, s, w8a16_tile(m, *q.shape)
            )
            for _, _, q, s in weights
        ],
    }
    if tiles:
        chains["w8a16 best"] = [
            functools.partial(w8a16_linear_triton, inputs[q.shape[1]], q, s, tiles[name])
            for name, _, q, s in weights
            if name in tiles
        ]
    record: dict[str, Any] = {"m": m, "layers": layers, "best_tiles": {
        name: dataclasses.asdict(tile) for name, tile in tiles.items()}}  # fmt: skip
    for name, calls in chains.items():
        try:
            record[name + " us"] = time_graph(calls, 20, quick) * len(calls)
        except Exception as error:
            record[name + " error"] = f"{type(error).__name__}: {error}"[:400]
            traceback.print_exc()
    print(f"chain at M={m}: {record}", flush=True)
    (out / f"chain-m{m}.json").write_text(json.dumps(record, indent=1) + "\n")


Linear = Callable[[torch.Tensor, int], torch.Tensor]  # (x, the index of a weight) → x @ w.T


def layer_chain(
    linear: Linear, layers: int, x: torch.Tensor, norm_weight: torch.Tensor
) -> Callable[[], torch.Tensor]:
    """``layers`` decode layers' kernels around ``linear``: weights ``4 * layer + (0: qkv,
    1: o, 2: gate_up, 3: down)``; attention's place between ``qkv`` and ``o`` is held by a
    small kernel (an RMS norm of ``qkv``'s first columns)."""
    o_inputs = SHAPES["o"][0]

    def run() -> torch.Tensor:
        hidden, residual = x, torch.zeros_like(x)
        for layer in range(layers):
            normed, residual = fused_add_rms_norm_triton(hidden, residual, norm_weight, 1e-5)
            attended = rms_norm_triton(linear(normed, 4 * layer)[:, :o_inputs], norm_weight, 1e-5)
            normed, residual = fused_add_rms_norm_triton(
                linear(attended, 4 * layer + 1), residual, norm_weight, 1e-5
            )
            hidden = linear(silu_and_mul_triton(linear(normed, 4 * layer + 2)), 4 * layer + 3)
        return hidden

    return run


def probe_pdl(out: Path, m: int, quick: bool) -> None:
    """A step's kernels at ``m`` rows launched with and without programmatic dependent
    launch (``INFER_DISABLE_PDL``)."""
    device = torch.device("cpu" if quick else "cuda")
    layers = 1 if quick else 28
    gen = torch.Generator(device=device).manual_seed(2)
    weights = layer_weights(layers, SHAPES, gen)
    hidden = SHAPES["qkv"][0]
    x = torch.randn(m, hidden, generator=gen, device=device, dtype=torch.bfloat16)
    norm_weight = torch.ones(hidden, device=device, dtype=torch.bfloat16)

    def fp8(a: torch.Tensor, index: int) -> torch.Tensor:
        _, _, q, s = weights[index]
        return w8a16_linear_triton(a, q, s, w8a16_tile(a.shape[0], *q.shape))

    def bf16(a: torch.Tensor, index: int) -> torch.Tensor:
        return F.linear(a, weights[index][1])

    variants: list[tuple[str, Linear, bool]] = [
        ("bf16, off", bf16, False),
        ("bf16, PDL", bf16, True),
        ("fp8, off", fp8, False),
        ("fp8, PDL", fp8, True),
    ]
    record: dict[str, Any] = {"m": m, "layers": layers}
    reference: dict[str, torch.Tensor] = {}
    for name, linear, pdl in variants:
        os.environ["INFER_DISABLE_PDL"] = "0" if pdl else "1"
        try:
            run = layer_chain(linear, layers, x, norm_weight)
            if quick:
                got = run()
                record[name + " us"] = float("nan")
            else:
                run()  # compile
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    got = run()
                record[name + " us"] = replay_ms(graph, 50) * 1e3
            kind = name.split(",")[0]
            reference.setdefault(kind, got.clone())  # the first of a kind runs without PDL
            record[name + " equal"] = bool(torch.equal(got, reference[kind]))
        except Exception as error:
            record[name + " error"] = f"{type(error).__name__}: {error}"[:400]
            traceback.print_exc()
        print(f"pdl M={m} {name}: {record.get(name + ' us')}", flush=True)
    os.environ.pop("INFER_DISABLE_PDL")
    (out / f"pdl-m{m}.json").write_text(json.dumps(record, indent=1) + "\n")


def best_table(records: list[dict[str, Any]]) -> str:
    """Per shape and M: bf16, the old FP8 path, the fused one, and the best W8A16 tile (µs)."""
    lines = [
        "| shape | M | bf16 | scaled_mm+eager | scaled_mm+fused | quant | best w8a16 (tile) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    order = list(SHAPES)
    keys = sorted(
        {(r["shape"], r["m"]) for r in records},
        key=lambda key: (order.index(key[0]) if key[0] in order else 0, key[1]),
    )
    for shape, m in keys:
        group = {r["method"]: r for r in records if r["shape"] == shape and r["m"] == m}
        cells = []
        for name in ("bf16", "scaled_mm+eager_quant", "scaled_mm+fused_quant", "fused_quant"):
            value = group.get(name, {}).get("us")
            cells.append("-" if value is None else f"{value:.1f}")
        w8 = [(r["us"], name[6:]) for name, r in group.items() if name[:5] == "w8a16" and "us" in r]
        cells.append(f"{min(w8)[0]:.1f} ({min(w8)[1]})" if w8 else "-")
        lines.append(f"| {shape} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="linear,profile", help="linear,tiles,chain,pdl,profile")
    parser.add_argument(
        "--profiles", default="bf16,fp8", help="of bf16, fp8 (weights), fp8kv (weights and KV)"
    )
    parser.add_argument("--quick", action="store_true", help="CPU smoke run")
    parser.add_argument("--budget-s", type=float, default=100.0, help="the linear part's bound")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    if "linear" in parts:
        try:
            probe_linear(args.out, args.quick, args.budget_s, ROWS, linear_methods, "linear")
        except Exception:
            traceback.print_exc()
    records: list[dict[str, Any]] = []
    if "tiles" in parts:
        try:
            records = probe_linear(
                args.out, args.quick, args.budget_s, [1, 2, 4, 8, 16], tile_methods, "tiles"
            )
        except Exception:
            traceback.print_exc()
    if "chain" in parts:
        for m in (1, 8):
            try:
                probe_chain(args.out, best_tiles(records, m), m, args.quick)
            except Exception:
                traceback.print_exc()
    if "pdl" in parts:
        for m in (1, 8):
            try:
                probe_pdl(args.out, m, args.quick)
            except Exception:
                traceback.print_exc()
    if "profile" in parts and not args.quick:
        sys.path.insert(0, str(Path(__file__).parent))
        from profile_decode_step import profile_decode_step

        profiles: dict[str, dict[str, Any]] = {
            "bf16": {},
            "fp8": {"quantization": "fp8"},
            "fp8kv": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
        }
        for label in args.profiles.split(","):
            options = profiles[label]
            try:
                profile_decode_step(args.out / f"profile-{label}", label, options)
            except Exception:
                traceback.print_exc()


if __name__ == "__main__":
    main()
