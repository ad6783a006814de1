"""How fast a workload could possibly run: bytes and FLOPs from the model config, ÷ the
device's measured copy bandwidth and matmul rate.

- A decode step reads every weight once (all but the embedding table, of which it gathers a
  few rows; a tied embedding is read once as the LM head) plus the K/V of every running
  sequence (Gemma 3's sliding layers only their window). Bound: bytes ÷ copy bandwidth.
- A prompt costs 2 FLOPs per weight per token in the linear layers, plus causal attention
  (QKᵀ and PV: 4 · heads · head_dim FLOPs per query-key pair, keys limited to the window),
  plus one LM-head product. Bound: FLOPs ÷ matmul rate.

Bursts are bounded as one batch that shrinks as requests finish; sequential workloads as one
request after another. Arrival times are ignored, so for staggered workloads the bound is a
batch bound, not what their arrival rate allows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from infer.config import ModelConfig
from infer.workloads import Workload


def measure_ceilings(
    device: torch.device,
    copy_bytes: int = 2 << 30,
    matmul_size: int = 8192,
    dtype: torch.dtype = torch.bfloat16,
    iters: int = 10,
) -> dict[str, float]:
    """Device-to-device copy bandwidth (TB/s, bytes read + written) and matmul TFLOP/s."""
    result = {
        "copy_tb_s": round(_copy_bandwidth(device, copy_bytes, dtype, iters) / 1e12, 3),
        "matmul_tflops": round(_matmul_rate(device, matmul_size, dtype, iters) / 1e12, 1),
    }
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _copy_bandwidth(device: torch.device, nbytes: int, dtype: torch.dtype, iters: int) -> float:
    src = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device=device).normal_()
    dst = torch.empty_like(src)
    seconds = _time(lambda: dst.copy_(src), device, iters)
    return 2 * src.numel() * dtype.itemsize / seconds


def _matmul_rate(device: torch.device, size: int, dtype: torch.dtype, iters: int) -> float:
    a = torch.randn(size, size, dtype=dtype, device=device)
    return 2 * size**3 / _time(lambda: a @ a, device, iters)


def _time(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    for _ in range(3):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / iters


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parameter_count(config: ModelConfig) -> int:
    """Weights of the model (a tied embedding counted once)."""
    hidden, q_dim = config.hidden_size, config.num_heads * config.head_dim
    kv_dim = config.num_kv_heads * config.head_dim
    attention = 2 * hidden * q_dim + 2 * hidden * kv_dim
    if config.attention_bias:
        attention += q_dim + 2 * kv_dim + hidden
    norms = 2 * hidden
    if config.model_type in ("qwen3", "gemma3_text"):
        norms += 2 * config.head_dim  # q_norm, k_norm
    if config.is_gemma:
        norms += 2 * hidden  # pre/post feed-forward norms
    layer = attention + 3 * hidden * config.intermediate_size + norms
    embeddings = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return config.num_layers * layer + embeddings + hidden


def decode_weight_bytes(config: ModelConfig, dtype_bytes: int = 2) -> int:
    """Weight bytes one decode step reads (the embedding table is only gathered from)."""
    untied_embedding = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    return (parameter_count(config) - untied_embedding) * dtype_bytes


def _attended(config: ModelConfig, context: np.ndarray) -> np.ndarray:
    """Key positions attended per query at each context length, summed over layers."""
    total = np.zeros_like(context, dtype=np.float64)
    for layer in range(config.num_layers):
        window = config.window_of_layer(layer)
        total += np.minimum(context, window) if window else context
    return total


def kv_bytes_read(config: ModelConfig, context: np.ndarray, dtype_bytes: int = 2) -> float:
    """K/V bytes decode reads for sequences at these context lengths (summed)."""
    per_position = 2 * config.num_kv_heads * config.head_dim * dtype_bytes
    return float(_attended(config, context).sum() * per_position)


def prefill_flops(config: ModelConfig, prompt_len: int) -> float:
    """FLOPs to prefill one prompt and compute its first token's logits."""
    linear = parameter_count(config) - config.vocab_size * config.hidden_size * (
        1 if config.tie_word_embeddings else 2
    )
    positions = np.arange(1, prompt_len + 1)
    attention = 4 * config.num_heads * config.head_dim * _attended(config, positions).sum()
    return float(2 * linear * prompt_len + attention + 2 * config.vocab_size * config.hidden_size)


def workload_roofline(
    config: ModelConfig,
    workload: Workload,
    ceilings: dict[str, float] | None,
    dtype_bytes: int = 2,
) -> dict[str, Any]:
    """Bytes and FLOPs of a whole workload and, given measured ceilings, its time and output
    tokens/s bounds."""
    prompts = [len(r.prompt_token_ids) for r in workload.requests]
    outputs = [r.max_tokens for r in workload.requests]
    flops = sum(prefill_flops(config, p) for p in prompts)
    # Decode steps produce tokens 2..n of each request at context prompt + 1 .. prompt + n - 1.
    contexts = np.concatenate(
        [p + np.arange(1, n, dtype=np.float64) for p, n in zip(prompts, outputs, strict=True)]
    )
    steps = sum(n - 1 for n in outputs) if workload.sequential else max(outputs) - 1
    weight_bytes = decode_weight_bytes(config, dtype_bytes)
    decode_bytes = steps * weight_bytes + kv_bytes_read(config, contexts, dtype_bytes)
    result: dict[str, Any] = {
        "mode": "sequential" if workload.sequential else "batch",
        "weight_bytes_per_step": weight_bytes,
        "decode_steps": steps,
        "decode_bytes": decode_bytes,
        "prefill_flops": flops,
    }
    if ceilings is not None:
        prefill_s = flops / (ceilings["matmul_tflops"] * 1e12)
        decode_s = decode_bytes / (ceilings["copy_tb_s"] * 1e12)
        result.update(
            ceilings,
            prefill_s=round(prefill_s, 4),
            decode_s=round(decode_s, 4),
            output_tok_s=round(workload.total_output_tokens / (prefill_s + decode_s), 1),
        )
    return result
