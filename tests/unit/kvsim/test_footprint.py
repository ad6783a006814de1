"""KV bytes per token and weight counts, from model configs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from infer.config import ModelConfig
from infer.kvsim.footprint import LAB_WINDOW_BLOCKS, footprint_of_config, load_footprint
from infer.loader.presets import preset_config


def test_lab_model_is_16_kib_per_token_without_weights() -> None:
    lab = load_footprint("lab")
    assert lab.bytes_per_token == 2 * 32 * 128 * 2 == 16 * 1024
    assert lab.weight_bytes == 0
    assert lab.block_bytes(16) == 16 * 16 * 1024


@pytest.mark.parametrize("model", ["llama-3.2-3b", "qwen3-4b", "gemma-3-1b"])
def test_bytes_per_token_is_layers_heads_dim_two_dtype(model: str) -> None:
    raw = preset_config(model)
    assert raw is not None
    footprint = load_footprint(model, dtype="float16")
    expected = raw["num_hidden_layers"] * raw["num_key_value_heads"] * raw["head_dim"] * 2 * 2
    assert footprint.bytes_per_token == expected


def test_gemma_windowed_layers_are_counted_as_such() -> None:
    gemma = load_footprint("gemma-3-1b")
    assert (gemma.window_layers, gemma.full_layers, gemma.window) == (22, 4, 512)
    assert load_footprint("llama-3.2-3b").window_layers == 0


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_weight_params_match_transformers(
    family: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    from transformers import AutoModelForCausalLM

    path = tiny_checkpoint(family)
    footprint = load_footprint(str(path), dtype="float32")
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert footprint.weight_params == reference.num_parameters()  # tied embeddings once
    assert footprint.weight_bytes == 4 * footprint.weight_params


def test_with_window_keeps_a_models_own_window_and_makes_one_up_otherwise() -> None:
    gemma = load_footprint("gemma-3-1b")
    assert gemma.with_window(None, 16) == gemma
    assert gemma.with_window(128, 16).window == 128
    assert gemma.with_window(128, 16).window_layers == 22
    llama = load_footprint("llama-3.2-1b").with_window(None, 32)
    assert (llama.window_layers, llama.window) == (llama.num_layers, LAB_WINDOW_BLOCKS * 32)
    with pytest.raises(ValueError, match=r"^window: "):
        gemma.with_window(0, 16)


def test_unknown_dtype_and_model_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"^dtype: "):
        load_footprint("lab", dtype="fp8")
    with pytest.raises(FileNotFoundError):
        load_footprint("no-such-model")


def test_footprint_of_config_reads_no_weights() -> None:
    raw = preset_config("llama-3.1-8b")
    assert raw is not None
    footprint = footprint_of_config("8b", ModelConfig.from_hf_dict(raw), "bfloat16")
    assert 8.0e9 < footprint.weight_params < 8.1e9


def test_an_fp8_cache_halves_the_bytes_per_token_not_the_weights() -> None:
    bf16, fp8 = load_footprint("llama-3.2-3b"), load_footprint("llama-3.2-3b", kv_cache_dtype="fp8")
    assert fp8.bytes_per_token * 2 == bf16.bytes_per_token
    assert fp8.weight_bytes == bf16.weight_bytes
    with pytest.raises(ValueError, match=r"^kv_cache_dtype: "):
        load_footprint("lab", kv_cache_dtype="int4")


def test_fp8_weights_count_a_byte_a_projection_weight_and_a_scale_a_row() -> None:
    bf16 = load_footprint("llama-3.2-3b")
    fp8 = load_footprint("llama-3.2-3b", quantization="fp8")
    # 28 layers of qkv (5,120 x 3,072), o (3,072 x 3,072), gate_up (16,384 x 3,072), down
    # (3,072 x 8,192); the embedding (tied LM head) and norms stay in bfloat16.
    per_layer = (5120 + 3072 + 16384) * 3072 + 3072 * 8192, 5120 + 3072 + 16384 + 3072
    assert (fp8.fp8_params, fp8.fp8_rows) == (28 * per_layer[0], 28 * per_layer[1])
    assert bf16.weight_bytes - fp8.weight_bytes == fp8.fp8_params - 4 * fp8.fp8_rows
    assert fp8.bytes_per_token == bf16.bytes_per_token
    with pytest.raises(ValueError, match=r"^quantization: "):
        load_footprint("llama-3.2-3b", quantization="int4")
