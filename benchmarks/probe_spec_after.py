"""Issue 51 on a GPU, in one bounded run: are the new kernels right when compiled, and what do
verify steps cost and gain now (``bench_speculative.py``'s parts, shortened)?

* ``kernels``: the decode kernel with several causal queries a row (``decode_queries``)
  against the torch reference (bfloat16 and float32, with and without split keys; over an
  FP8 cache too), and the verify-input and accept kernels against their references, on CUDA
  tensors.
* ``verify``: the verify table for ``--ks`` (an engine each, dummy llama-3.2-3b).
  (``kernels`` runs only when asked: the other parts check the kernels end to end.)
* ``quoting``: SmolLM2-135M (the GGUF), the quoting prompts, greedy, batch 1 and 8, n-gram
  speculation against none in the same process: tok/s, acceptance, identical outputs.
* ``burst``: ``burst256`` (dummy llama-3.2-3b, greedy), speculation off then on.

    python benchmarks/probe_spec_after.py [--parts kernels,verify,quoting,burst] [--gguf F]
        [--ks 1,4]

Writes ``probe_spec_after.json`` under ``--out`` (default ``$OUT/spec``) after every part.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_speculative
from infer.attention.metadata import ScheduledSequence, build_metadata
from infer.attention.torch_backend import paged_attention_torch
from infer.kernels.fp8 import to_fp8
from infer.kernels.paged_attention import paged_attention
from infer.kernels.verify_inputs import (
    ProposalMode,
    RowStarts,
    VerifyInputs,
    VerifyShape,
    accept_proposals,
    verify_inputs_torch,
)
from infer.kernels.verify_inputs_triton import (
    accept_proposals_triton,
    verify_inputs_triton,
)


def _device() -> torch.device:
    """CUDA; the CPU (under ``TRITON_INTERPRET=1``) only to try the script."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _attention_case(
    specs: list[tuple[int, int]],
    queries: int,
    dtype: torch.dtype,
    splits: int | None,
    kv_scales: tuple[float, float] | None = None,
) -> float:
    """Max abs error of the decode kernel against the reference on one batch (``kv_scales``:
    over an FP8 cache holding K and V divided by them)."""
    cuda = _device()
    generator = torch.Generator().manual_seed(len(specs) * 7 + queries)
    heads, kv_heads, head_dim, block_size = 24, 8, 128, 16
    needed = [-(-ctx // block_size) for ctx, _ in specs]
    blocks = torch.randperm(sum(needed) + 3, generator=generator).tolist()
    seqs, used = [], 0
    for (ctx, qlen), n in zip(specs, needed, strict=True):
        seqs.append(ScheduledSequence(blocks[used : used + n], ctx - qlen, [0] * qlen))
        used += n
    _, meta = build_metadata(seqs, block_size, cuda)
    meta.decode_queries = queries
    shape = (sum(needed) + 3, kv_heads, block_size, head_dim)
    k = torch.randn(shape, generator=generator).to(cuda, dtype)
    v = torch.randn(shape, generator=generator).to(cuda, dtype)
    q = torch.randn(meta.positions.shape[0], heads, head_dim, generator=generator).to(cuda, dtype)
    if kv_scales is None:
        out = paged_attention(q, k, v, meta, head_dim**-0.5, num_splits=splits)
        ref = paged_attention_torch(q.float(), k.float(), v.float(), meta, head_dim**-0.5)
    else:
        k, v = to_fp8(k.float(), kv_scales[0]), to_fp8(v.float(), kv_scales[1])
        scale = head_dim**-0.5
        out = paged_attention(q, k, v, meta, scale, num_splits=splits, kv_scales=kv_scales)
        ref = paged_attention_torch(q.float(), k, v, meta, scale, 0, kv_scales)
    return float((out.float() - ref).abs().max())


def kernels(_: argparse.Namespace) -> dict[str, Any]:
    """Each check on its own: one that fails (or raises) leaves the others' results."""
    results: dict[str, Any] = {"attention": []}
    for dtype in (torch.bfloat16, torch.float32):
        for queries, specs in ((2, [(300, 2), (40, 1)]), (5, [(900, 5), (70, 3), (6, 5)]),
                               (9, [(2000, 9), (33, 4)])):  # fmt: skip
            for splits in (None, 1, 3, 7):
                case: dict[str, Any] = {"dtype": str(dtype), "queries": queries, "splits": splits}
                try:
                    error = _attention_case(specs, queries, dtype, splits)
                    tolerance = 2e-2 if dtype == torch.bfloat16 else 2e-3
                    case.update(max_abs_error=error, ok=error < tolerance)
                except Exception:
                    case.update(error=traceback.format_exc(limit=-3), ok=False)
                results["attention"].append(case)
    for splits in (1, 3, 7):  # verify rows over an FP8 cache (the combine kernel at 7)
        case = {"dtype": "bfloat16, fp8 cache", "queries": 5, "splits": splits}
        try:
            error = _attention_case(
                [(900, 5), (70, 3), (6, 5)], 5, torch.bfloat16, splits, (0.02, 0.03)
            )
            case.update(max_abs_error=error, ok=error < 2e-2)
        except Exception:
            case.update(error=traceback.format_exc(limit=-3), ok=False)
        results["attention"].append(case)
    for name, check in (("verify_inputs_same", _verify_inputs_same), ("accept_same", _accept_same)):
        try:
            results[name] = check()
        except Exception:
            results[name] = False
            results[f"{name}_error"] = traceback.format_exc(limit=-3)
    results["ok"] = (
        all(r["ok"] for r in results["attention"])
        and results["verify_inputs_same"]
        and results["accept_same"]
    )
    return results


def _verify_inputs_same() -> bool:
    cuda, queries, block_size = _device(), 5, 16
    generator = torch.Generator().manual_seed(3)
    rows = 6
    lengths = [700, 40, 9, 300, 1, 2000]
    width = max(-(-(n + queries) // block_size) for n in lengths)
    tables = torch.randperm(rows * width, generator=generator).view(rows, width).int()
    history = torch.randint(0, 5, (rows * width * block_size + 1,), generator=generator).int()
    starts = RowStarts(
        first=torch.randint(0, 5, (rows,), generator=generator),
        base=torch.tensor(lengths) - 1,
        limit=torch.tensor([4, 4, 2, 0, 4, 3], dtype=torch.int32),
        mode=torch.tensor([int(ProposalMode.NGRAM)], dtype=torch.int32),
        given=torch.zeros(rows, 1, dtype=torch.int64),
        num_rows=torch.tensor([rows - 1, 0], dtype=torch.int32),
    )
    outputs = []
    for fill, device in ((verify_inputs_torch, torch.device("cpu")), (verify_inputs_triton, cuda)):
        out = VerifyInputs(
            *(torch.zeros(rows * queries, dtype=torch.int64, device=device) for _ in range(3)),
            torch.zeros(rows, dtype=torch.int32, device=device),
            torch.zeros(rows, dtype=torch.int32, device=device),
        )
        moved = RowStarts(*(getattr(starts, f).to(device) for f in starts.__dataclass_fields__))
        fill(out, moved, tables.to(device), history.to(device), VerifyShape(queries, 1, 3),
             block_size)  # fmt: skip
        outputs.append([t.cpu() for t in vars(out).values()])
    return all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))


def _accept_same() -> bool:
    generator = torch.Generator().manual_seed(4)
    rows, queries = 40, 5
    samples = torch.randint(0, 2, (rows * queries,), generator=generator)
    inputs = torch.randint(0, 2, (rows * queries,), generator=generator)
    counts = torch.randint(0, queries, (rows,), generator=generator).int()
    packed = torch.zeros(rows * (queries + 2), dtype=torch.int64)
    continues = accept_proposals(samples, inputs, counts, queries, packed)
    cuda = _device()
    cuda_packed = torch.zeros_like(packed).to(cuda)
    cuda_continues = torch.zeros(rows, dtype=torch.int64, device=cuda)
    accept_proposals_triton(
        samples.to(cuda), inputs.to(cuda), counts.to(cuda), queries, cuda_packed, cuda_continues
    )
    return torch.equal(cuda_packed.cpu(), packed) and torch.equal(cuda_continues.cpu(), continues)


def verify(args: argparse.Namespace) -> list[dict[str, Any]]:
    return bench_speculative.verify_costs(args.dummy_model, args.steps, args.ks)


def quoting(args: argparse.Namespace) -> list[dict[str, Any]]:
    from infer.bench.checkpoint import write_gguf_checkpoint
    from infer.loader.presets import embedded_model_path

    folder = write_gguf_checkpoint(Path("/tmp/smollm2-hf"), args.gguf or embedded_model_path())
    return bench_speculative.quoting("infer", folder, args.max_tokens)


def burst(args: argparse.Namespace) -> list[dict[str, Any]]:
    return bench_speculative.burst(args.dummy_model, 1)


PARTS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "kernels": kernels,
    "verify": verify,
    "quoting": quoting,
    "burst": burst,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="verify,quoting,burst", help=", ".join(PARTS))
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--dummy-model", default="llama-3.2-3b")
    parser.add_argument("--ks", default="1,4", help="verify: proposals a row")
    parser.add_argument("--steps", type=int, default=128, help="verify: steps a case")
    parser.add_argument("--max-tokens", type=int, default=256, help="quoting: outputs")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "spec")
    args = parser.parse_args()
    args.ks = [int(k) for k in args.ks.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    record: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu"}
    for part in args.parts.split(","):
        started = time.perf_counter()
        print(f"== {part}", flush=True)
        try:
            record[part] = PARTS[part](args)
        except Exception:
            record[part] = {"error": traceback.format_exc()}
            print(record[part]["error"], flush=True)
        record[f"{part}_s"] = round(time.perf_counter() - started, 1)
        print(f"== {part}: {record[f'{part}_s']} s", flush=True)
        (args.out / "probe_spec_after.json").write_text(json.dumps(record, indent=1) + "\n")
    bench_speculative.print_table(record)
    if isinstance(record.get("kernels"), dict):
        print("kernels ok:", record["kernels"].get("ok"))


if __name__ == "__main__":
    main()
