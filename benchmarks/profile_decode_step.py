"""Where one decode step of batch 1 spends its GPU time (llama-3.2-3b, dummy weights, CUDA
graphs): ms a step (host work included, steps run one after another) and the graph replay's
kernels grouped by kind and by name, written to ``DIR/profile.json`` and ``DIR/profile.md``.

    PYTHONPATH=src python benchmarks/profile_decode_step.py DIR [--quantization fp8]
        [--kv-cache-dtype fp8] [--model llama-3.2-3b] [--context 128]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from infer import LLM, SamplingParams

# First match wins: the W8A16 kernel and cuBLAS(Lt) before the eager quantisation's ops.
KINDS = (
    ("w8a16 (Triton)", ("_w8a16",)),
    ("gemm", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "splitkreduce", "scaled_mm")),
    ("attention", ("_decode_kernel", "_prefill_kernel", "_combine_kernel")),
    (
        "fp8 quantisation",
        ("_quantize_rows", "float8_copy", "absfunctor", "reduceop<float", "bunaryfunctor", "clamp"),
    ),
    ("norm/rope/act/kv", ("rms", "rope", "silu", "gelu", "kv_write", "_norm", "_gated_act")),
    ("sampling", ("sampl", "argmax", "topk", "softmax")),
)


PROFILED = 5  # steps under the profiler, averaged
ACTIVITIES = [ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]


def _sync() -> None:
    if torch.cuda.is_available():  # (a CPU run only checks the script)
        torch.cuda.synchronize()


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((k for k, keys in KINDS if any(key.lower() in lowered for key in keys)), "other")


def profile_decode_step(
    out: Path,
    label: str,
    options: dict[str, Any],
    model: str = "llama-3.2-3b",
    context: int = 128,
    steps: int = 100,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    llm = LLM(
        model,
        load_format="dummy",
        max_batch_size=4,
        max_graph_tokens=256,
        max_seq_len=4096,
        num_gpu_blocks=1024,  # a small pool: two engines of one process both fit
        use_async_scheduling=False,
        **options,
    )
    engine = llm.engine
    print(f"{label}: engine ready in {time.perf_counter() - started:.0f} s", flush=True)
    params = SamplingParams(temperature=0, max_tokens=3000, ignore_eos=True, detokenize=False)
    prompt = torch.randint(1000, 20000, (context,), generator=torch.Generator().manual_seed(0))
    engine.add_request(prompt.tolist(), params)
    for _ in range(min(8, steps)):  # prefill, then a few decode steps
        engine.step()
    _sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync()
    ms_step = (time.perf_counter() - start) * 1e3 / steps
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(PROFILED):
            engine.step()
        _sync()
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_kind[kind_of(event.name)] += event.device_time / PROFILED
            by_name[event.name][0] += 1 / PROFILED
            by_name[event.name][1] += event.device_time / PROFILED
    gpu_us = sum(by_kind.values()) or float("nan")
    record = {
        "label": label,
        "options": options,
        "model": model,
        "context": context,
        "ms_per_step": ms_step,
        "tok_s": 1e3 / ms_step,
        "gpu_us_per_step": gpu_us,
        "by_kind_us": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "by_kernel": [
            {"name": name, "calls": calls, "us": us}
            for name, (calls, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])
        ],
    }
    lines = [
        f"{label}: {ms_step:.3f} ms a step ({1e3 / ms_step:.1f} tok/s), "
        f"{gpu_us:.0f} us of kernels a step",
        "",
        "| kind | us a step | share |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {kind} | {us:.1f} | {100 * us / gpu_us:.1f} % |"
        for kind, us in record["by_kind_us"].items()
    ]
    lines += ["", "| kernel | calls a step | us a step |", "|---|---:|---:|"]
    lines += [
        f"| `{k['name'][:80]}` | {k['calls']:.0f} | {k['us']:.1f} |"
        for k in record["by_kernel"][:25]
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    (out / "profile.md").write_text(text + "\n")
    (out / "profile.json").write_text(json.dumps(record, indent=1) + "\n")
    engine.close()
    del llm, engine
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="llama-3.2-3b")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    args = parser.parse_args()
    options: dict[str, Any] = {"kv_cache_dtype": args.kv_cache_dtype}
    if args.quantization:
        options["quantization"] = args.quantization
    label = f"{args.quantization or 'bf16'} weights, {args.kv_cache_dtype} KV"
    profile_decode_step(args.out, label, options, args.model, args.context, args.steps)


if __name__ == "__main__":
    main()
