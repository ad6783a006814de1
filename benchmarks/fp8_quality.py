"""FP8 quality on real weights, on the CPU: next-token agreement and perplexity.

Every configuration reads the same text in windows of ``--window`` tokens (each window a
fresh prefill, every position predicting the next token) and is compared position by
position with the float32 model and the bfloat16 one: top-1 agreement, mean KL divergence
from float32, and perplexity of the text. FP8 weights run the CPU references of the GPU's
two paths: W8A8 (activations quantised per token, then ``torch._scaled_mm``: a GPU's
prefill and steps of many rows) and W8A16 (activations as they are, the Triton kernel: a
GPU's decode steps of few rows). An FP8 KV cache is written and read by the torch attention
path (scale 1 per tensor: a GGUF file carries no KV scales).

    PYTHONPATH=src python benchmarks/fp8_quality.py [--model smollm2-135m] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import infer.models.fp8 as fp8_module
from infer.attention import ScheduledSequence, build_metadata
from infer.loader import ModelSource, load_model, resolve_model
from infer.models import DecoderModel
from infer.tokenizer import Tokenizer

TEXT = Path(__file__).parent / "data" / "quality_text.txt"
BLOCK = 16
FP8 = torch.float8_e4m3fn
# (label, activation / model dtype, weight quantization, KV cache dtype or None: the model's,
# FP8 matmul: W8A16 for every row count or W8A8 for every one)
CONFIGS = [
    ("float32", torch.float32, None, None, False),
    ("bfloat16", torch.bfloat16, None, None, False),
    ("fp8 weights W8A8, float32 activations", torch.float32, "fp8", None, False),
    ("fp8 weights W8A8, bfloat16 activations", torch.bfloat16, "fp8", None, False),
    ("fp8 weights W8A16, bfloat16 activations", torch.bfloat16, "fp8", None, True),
    ("bfloat16, fp8 KV cache", torch.bfloat16, None, FP8, False),
    ("fp8 weights W8A8, bfloat16, fp8 KV cache", torch.bfloat16, "fp8", FP8, False),
    ("fp8 weights W8A16, bfloat16, fp8 KV cache", torch.bfloat16, "fp8", FP8, True),
]
ALL_ROWS = 1 << 30  # a W8A16 switch point past any window


@dataclass
class Score:
    label: str
    positions: int = 0
    agree_fp32: int = 0
    agree_bf16: int = 0
    nll: float = 0.0
    kl_fp32: float = 0.0

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.positions)


def window_logits(model: DecoderModel, tokens: list[int], kv_dtype: torch.dtype) -> torch.Tensor:
    """float32 log-probabilities ``[len(tokens), vocab]`` of one prefill from scratch."""
    config = model.config
    blocks = -(-len(tokens) // BLOCK)
    shape = (config.num_layers, blocks, config.num_kv_heads, BLOCK, config.head_dim)
    model.bind_kv_cache(torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype))
    seq = ScheduledSequence(list(range(blocks)), 0, tokens)
    ids, meta = build_metadata([seq], BLOCK, torch.device("cpu"))
    return F.log_softmax(model.compute_logits(model(ids, meta)).float(), dim=-1)


@torch.inference_mode()
def evaluate(source: ModelSource, tokens: list[int], window: int) -> list[Score]:
    models = {
        label: load_model(source, torch.device("cpu"), dtype, window, quantization=quant)[0]
        for label, dtype, quant, _, _ in CONFIGS
    }
    kv_dtypes = {label: kv or dtype for label, dtype, _, kv, _ in CONFIGS}
    w8a16 = {label: few_rows for label, *_, few_rows in CONFIGS}
    scores = {label: Score(label) for label in models}
    for start in range(0, len(tokens) - 1, window):
        chunk = tokens[start : start + window + 1]
        inputs, targets = chunk[:-1], torch.tensor(chunk[1:])
        logprobs = {}
        for label, model in models.items():
            fp8_module.W8A16_MAX_ROWS = ALL_ROWS if w8a16[label] else 0
            logprobs[label] = window_logits(model, inputs, kv_dtypes[label])
        print(f"window at {start}: done", file=sys.stderr, flush=True)
        top_fp32 = logprobs["float32"].argmax(-1)
        top_bf16 = logprobs["bfloat16"].argmax(-1)
        for label, lp in logprobs.items():
            score, top = scores[label], lp.argmax(-1)
            score.positions += len(targets)
            score.agree_fp32 += int((top == top_fp32).sum())
            score.agree_bf16 += int((top == top_bf16).sum())
            score.nll -= float(lp.gather(1, targets[:, None]).sum())
            reference = logprobs["float32"]
            score.kl_fp32 += float((reference.exp() * (reference - lp)).sum())
    return list(scores.values())


def table(scores: list[Score]) -> str:
    reference = scores[0].perplexity
    lines = [
        "| weights, activations | positions | top-1 = float32 | top-1 = bfloat16 | "
        "mean KL from float32 (nats) | perplexity | vs float32 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in scores:
        lines.append(
            f"| {s.label} | {s.positions} | {100 * s.agree_fp32 / s.positions:.2f} % | "
            f"{100 * s.agree_bf16 / s.positions:.2f} % | {s.kl_fp32 / s.positions:.5f} | "
            f"{s.perplexity:.3f} | {100 * (s.perplexity / reference - 1):+.2f} % |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--text", type=Path, default=TEXT)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--out", type=Path, help="directory for quality.json")
    args = parser.parse_args()
    source = resolve_model(args.model)
    assert source.tokenizer_path is not None
    tokenizer = Tokenizer.load(source.tokenizer_path)
    assert tokenizer is not None, f"{args.model} ships no tokenizer"
    tokens = tokenizer.encode(args.text.read_text())
    started = time.perf_counter()
    scores = evaluate(source, tokens, args.window)
    print(f"{args.model}: {len(tokens)} tokens of {args.text.name}, windows of {args.window}")
    print(table(scores))
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            "model": args.model,
            "text": str(args.text),
            "tokens": len(tokens),
            "window": args.window,
            "scores": [{**asdict(s), "perplexity": s.perplexity} for s in scores],
        }
        (args.out / "quality.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
