"""Where one decode step spends its GPU time (llama-3.2-3b, dummy weights, CUDA graphs): ms a
step (host work included, steps run one after another) and the graph replay's kernels grouped
by kind and by name, written to ``DIR/profile.json`` and ``DIR/profile.md``. With
``--prefill``, the same for the steps that prefill one prompt of ``--context`` tokens (after
one such prompt unprofiled, so first-use costs stay out). Kernels launched with programmatic
dependent launch start before the one ahead ends, and their time includes that wait
(``INFER_DISABLE_PDL=1`` for each kernel's own time).

    PYTHONPATH=src python benchmarks/profile_decode_step.py DIR [--quantization fp8]
        [--kv-cache-dtype fp8] [--model llama-3.2-3b] [--context 128] [--batch 1] [--prefill]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from infer import LLM, SamplingParams

# First match wins: the W8A16 kernel and cuBLAS(Lt) before the eager quantisation's ops.
KINDS = (
    ("w8a16 (Triton)", ("_w8a16",)),
    ("gemm", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "splitkreduce", "scaled_mm")),
    (
        "attention",
        ("_decode_kernel", "_prefill_kernel", "_combine_kernel", "sdpa", "fmha", "flash", "_merge"),
    ),
    ("kv gather", ("_gather",)),
    (
        "fp8 quantisation",
        ("_quantize_rows", "float8_copy", "absfunctor", "reduceop<float", "bunaryfunctor", "clamp"),
    ),
    ("norm/rope/act/kv", ("rms", "rope", "silu", "gelu", "kv_write", "_norm", "_gated_act")),
    ("sampling", ("sampl", "argmax", "topk", "softmax")),
)


PROFILED = 5  # steps under the profiler, averaged
ACTIVITIES = [ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]
BLOCK = 16  # tokens a KV block (the engine's default)


def _sync() -> None:
    if torch.cuda.is_available():  # (a CPU run only checks the script)
        torch.cuda.synchronize()


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((k for k, keys in KINDS if any(key.lower() in lowered for key in keys)), "other")


def _engine(model: str, options: dict[str, Any], batch: int, max_seq_len: int) -> LLM:
    """An engine for ``batch`` sequences of up to ``max_seq_len`` tokens: a pool just that
    large (two engines of one process both fit), synchronous steps (one step's kernels at a
    time)."""
    seq_len = max(4096, max_seq_len)
    return LLM(
        model,
        load_format="dummy",
        max_batch_size=max(4, batch),
        max_graph_tokens=256,
        max_seq_len=seq_len,
        num_gpu_blocks=max(batch * -(-max_seq_len // BLOCK), -(-seq_len // BLOCK)) + 64,
        use_async_scheduling=False,
        **options,
    )


def _prompt(length: int, seed: int) -> list[int]:
    """Random token ids: prompts of different seeds share no cached prefix."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1000, 20000, (length,), generator=generator).tolist()


def _profiled(run: Callable[[], int]) -> tuple[int, dict[str, float], dict[str, list[float]]]:
    """``run``'s kernels under the profiler, by kind (the largest first) and by name (us;
    calls and us per step, ``run`` returning how many steps it ran)."""
    with profile(activities=ACTIVITIES) as prof:
        steps = run()
        _sync()
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_kind[kind_of(event.name)] += event.device_time / steps
            by_name[event.name][0] += 1 / steps
            by_name[event.name][1] += event.device_time / steps
    return steps, dict(sorted(by_kind.items(), key=lambda kv: -kv[1])), by_name


def _write(out: Path, record: dict[str, Any], title: str, by_name: dict[str, list[float]]) -> None:
    gpu_us = sum(record["by_kind_us"].values()) or float("nan")
    record["gpu_us_per_step"] = gpu_us
    record["by_kernel"] = [
        {"name": name, "calls": calls, "us": us}
        for name, (calls, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])
    ]
    lines = [f"{title}, {gpu_us:.0f} us of kernels a step", "", "| kind | us a step | share |"]
    lines += ["|---|---:|---:|"]
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
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.md").write_text(text + "\n")
    (out / "profile.json").write_text(json.dumps(record, indent=1) + "\n")


def profile_decode_step(
    out: Path,
    label: str,
    options: dict[str, Any],
    model: str = "llama-3.2-3b",
    context: int = 128,
    steps: int = 100,
    batch: int = 1,
) -> dict[str, Any]:
    """``batch`` rows decoding over ``context`` tokens each."""
    started = time.perf_counter()
    # Rows decode beside the later prompts' chunks: room for a token per prefill step.
    max_tokens = 16 + steps + PROFILED + batch * -(-context // 1024)
    llm = _engine(model, options, batch, context + max_tokens)
    engine = llm.engine
    print(f"{label}: engine ready in {time.perf_counter() - started:.0f} s", flush=True)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    for seed in range(batch):
        engine.add_request(_prompt(context, seed), params)
    decoding: set[str] = set()
    while len(decoding) < batch:  # prefill every row (decode rows ride beside)
        decoding.update(o.request_id for o in engine.step() if o.new_token_ids)
    for _ in range(4):
        engine.step()
    _sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync()
    ms_step = (time.perf_counter() - start) * 1e3 / steps

    def run() -> int:
        for _ in range(PROFILED):
            engine.step()
        return PROFILED

    _, by_kind, by_name = _profiled(run)
    record = {
        "label": label, "options": options, "model": model, "context": context, "batch": batch,
        "ms_per_step": ms_step, "tok_s": batch * 1e3 / ms_step, "by_kind_us": by_kind,
    }  # fmt: skip
    title = f"{label}, {batch} x {context}: {ms_step:.3f} ms a step ({record['tok_s']:.1f} tok/s)"
    _write(out, record, title, by_name)
    engine.close()  # (the engine's memory goes with this frame)
    return record


def profile_prefill(
    out: Path, label: str, options: dict[str, Any], model: str, context: int
) -> dict[str, Any]:
    """The steps that prefill one prompt of ``context`` tokens, up to its first token."""
    llm = _engine(model, options, 2, context + 1)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, detokenize=False)

    def run(seed: int) -> int:
        engine.add_request(_prompt(context, seed), params)
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        return steps

    run(0)  # the first prompt of this length: planning and first-use costs
    _sync()
    start = time.perf_counter()
    run(1)
    _sync()
    ms = (time.perf_counter() - start) * 1e3
    steps, by_kind, by_name = _profiled(lambda: run(2))
    record = {
        "label": label, "options": options, "model": model, "context": context,
        "prefill_ms": ms, "steps": steps, "tok_s": context * 1e3 / ms,
        "by_kind_us": by_kind,
    }  # fmt: skip
    title = f"{label}, a {context}-token prompt: {ms:.1f} ms in {steps} steps"
    _write(out, record, title, by_name)
    engine.close()  # (the engine's memory goes with this frame)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="llama-3.2-3b")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1, help="decode rows")
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    parser.add_argument("--prefill", action="store_true", help="profile a prompt's prefill")
    args = parser.parse_args()
    options: dict[str, Any] = {"kv_cache_dtype": args.kv_cache_dtype}
    if args.quantization:
        options["quantization"] = args.quantization
    label = f"{args.quantization or 'bf16'} weights, {args.kv_cache_dtype} KV"
    if args.prefill:
        profile_prefill(args.out, label, options, args.model, args.context)
    else:
        profile_decode_step(
            args.out, label, options, args.model, args.context, args.steps, args.batch
        )


if __name__ == "__main__":
    main()
