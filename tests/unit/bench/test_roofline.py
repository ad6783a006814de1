"""Roofline: parameter counts match transformers, bytes and FLOPs match hand counts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from infer.bench.roofline import (
    decode_weight_bytes,
    kv_bytes_read,
    measure_ceilings,
    parameter_count,
    prefill_flops,
    workload_roofline,
)
from infer.config import ModelConfig
from infer.loader.presets import preset_config
from infer.workloads import RequestSpec, Workload

FAMILIES = ("llama", "qwen3", "gemma3")


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint: Callable[[str], Path]) -> Callable[[str], dict[str, Any]]:
    """``tiny(family)`` → ``config.json`` of the shared tiny checkpoint."""
    return lambda family: json.loads((tiny_checkpoint(family) / "config.json").read_text())


def _hf_parameters(raw: dict[str, Any]) -> int:
    raw = dict(raw)
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_matches_transformers_tiny(
    family: str, tiny: Callable[[str], dict[str, Any]]
) -> None:
    raw = tiny(family)
    assert parameter_count(ModelConfig.from_hf_dict(raw)) == _hf_parameters(raw)


@pytest.mark.parametrize("preset", ["llama-3.2-3b", "qwen3-4b", "gemma-3-1b"])
def test_parameter_count_matches_transformers_presets(preset: str) -> None:
    raw = preset_config(preset)
    assert raw is not None
    assert parameter_count(ModelConfig.from_hf_dict(raw)) == _hf_parameters(raw)


def test_decode_reads_the_lm_head_but_not_an_untied_embedding(
    tiny: Callable[[str], dict[str, Any]],
) -> None:
    tied = ModelConfig.from_hf_dict(tiny("qwen3"))
    assert decode_weight_bytes(tied, 2) == 2 * parameter_count(tied)
    untied = ModelConfig.from_hf_dict(tiny("llama"))  # vocab 320, hidden 64
    assert decode_weight_bytes(untied, 4) == 4 * (parameter_count(untied) - 320 * 64)


def test_kv_bytes_respect_sliding_windows(tiny: Callable[[str], dict[str, Any]]) -> None:
    llama = ModelConfig.from_hf_dict(tiny("llama"))  # 3 layers, 2 kv heads x 16
    per_position = 2 * 2 * 16 * 2
    assert kv_bytes_read(llama, np.array([10.0, 30.0])) == 3 * 40 * per_position
    gemma = ModelConfig.from_hf_dict(tiny("gemma3"))  # 4 layers, window 8 on 0 and 2
    per_position = 2 * 1 * 32 * 2
    assert gemma.window_of_layer(0) == 8 and gemma.window_of_layer(1) == 0
    assert kv_bytes_read(gemma, np.array([20.0])) == (8 + 20 + 8 + 20) * per_position


def test_prefill_flops_by_hand(tiny: Callable[[str], dict[str, Any]]) -> None:
    config = ModelConfig.from_hf_dict(tiny("llama"))
    hidden, inter, heads, kv_heads, dim, vocab = 64, 128, 4, 2, 16, 320
    layer = 2 * hidden * heads * dim + 2 * hidden * kv_heads * dim + 3 * hidden * inter
    linear = 3 * (layer + 2 * hidden) + hidden  # projections and norms of 3 layers, final norm
    length = 5
    attention = 4 * heads * dim * 3 * sum(range(1, length + 1))
    expected = 2 * linear * length + attention + 2 * vocab * hidden
    assert prefill_flops(config, length) == expected


def test_workload_roofline_batch_and_sequential(tiny: Callable[[str], dict[str, Any]]) -> None:
    config = ModelConfig.from_hf_dict(tiny("llama"))
    requests = [RequestSpec([1] * 4, 3), RequestSpec([1] * 2, 5)]
    burst = workload_roofline(config, Workload("w", "", requests), None)
    sequential = workload_roofline(config, Workload("w", "", requests, sequential=True), None)
    assert burst["decode_steps"] == 4 and sequential["decode_steps"] == 6
    # The same (request, step) contexts are read either way; only the weight reads differ.
    weights = decode_weight_bytes(config)
    assert sequential["decode_bytes"] - burst["decode_bytes"] == 2 * weights
    assert "output_tok_s" not in burst
    bounded = workload_roofline(
        config, Workload("w", "", requests), {"copy_tb_s": 1.0, "matmul_tflops": 1.0}
    )
    seconds = burst["prefill_flops"] / 1e12 + burst["decode_bytes"] / 1e12
    assert bounded["output_tok_s"] == pytest.approx(8 / seconds, rel=1e-3)


def test_ceilings_measure_on_the_cpu() -> None:
    ceilings = measure_ceilings(
        torch.device("cpu"), copy_bytes=1 << 20, matmul_size=64, dtype=torch.float32, iters=2
    )
    assert ceilings["copy_tb_s"] >= 0.0 and ceilings["matmul_tflops"] >= 0.0
    assert set(ceilings) == {"copy_tb_s", "matmul_tflops"}
