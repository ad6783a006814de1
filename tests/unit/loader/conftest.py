"""Fixtures of the loader tests: tiny GGUF files converted the way llama.cpp converts."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q

from infer.config import ModelConfig

from .helpers import random_hf_model, to_llama_cpp, write_gguf

# A mix of types like a Q4_K_M file's (names common to all three families); everything else
# stays F32. K-quant rows need 256 values, hence ffn_down of an intermediate size of 256.
# (Every other type gguf dequantises is checked one by one in test_gguf.py.)
QUANT_TYPES = {
    "token_embd.weight": Q.Q8_0,
    "blk.0.attn_q.weight": Q.Q4_0,
    "blk.0.attn_k.weight": Q.Q4_1,
    "blk.1.attn_q.weight": Q.Q5_0,
    "blk.1.attn_k.weight": Q.Q5_1,
    "blk.0.attn_v.weight": Q.BF16,
    "blk.0.attn_output.weight": Q.F16,
    "blk.0.ffn_down.weight": Q.Q4_K,
    "blk.1.ffn_down.weight": Q.Q5_K,
    "blk.2.ffn_down.weight": Q.Q6_K,
}


@dataclass
class TinyGGUF:
    path: Path
    config: ModelConfig  # what the file describes
    hf_model: Any  # the transformers model it was converted from


def gguf_hf_config(tiny_config: dict[str, Any]) -> dict[str, Any]:
    """A tiny family config that a GGUF file can express: K-quantisable ``ffn_down`` rows,
    plain RoPE for Llama (scaled RoPE is a separate test), and for Gemma the layer pattern
    and attention scale llama.cpp assumes (every 6th layer global, 1/sqrt(head_dim))."""
    dropped = ("rope_scaling", "rope_parameters", "layer_types", "_sliding_window_pattern")
    raw = {k: v for k, v in tiny_config.items() if k not in dropped}
    raw["intermediate_size"] = 256
    raw["rope_theta"] = 10_000.0 if raw["model_type"] == "llama" else 1_000_000.0
    if raw["model_type"] == "gemma3_text":
        raw.update(
            num_hidden_layers=6,
            sliding_window_pattern=6,
            query_pre_attn_scalar=raw["head_dim"],
            rope_local_base_freq=10_000.0,
        )
    return raw


@pytest.fixture(scope="session")
def tiny_config(tiny_checkpoint: Callable[[str], Path]) -> Callable[[str], dict[str, Any]]:
    """``tiny_config(family)`` → the ``config.json`` of the shared tiny checkpoint."""

    def read(family: str) -> dict[str, Any]:
        config: dict[str, Any] = json.loads((tiny_checkpoint(family) / "config.json").read_text())
        return config

    return read


@pytest.fixture(scope="session")
def tiny_gguf(
    tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[[str], dict[str, Any]]
) -> Callable[[str], TinyGGUF]:
    """``tiny_gguf(family)`` → a GGUF file of a random tiny model with mixed tensor types
    (see ``QUANT_TYPES``), and the model it came from."""
    made: dict[str, TinyGGUF] = {}

    def make(family: str) -> TinyGGUF:
        if family not in made:
            hf_model = random_hf_model(gguf_hf_config(tiny_config(family)))
            config = ModelConfig.from_hf_dict(hf_model.config.to_dict())
            path = tmp_path_factory.mktemp(f"gguf-{family}") / f"tiny-{family}.gguf"
            write_gguf(path, config, to_llama_cpp(config, hf_model.state_dict()), QUANT_TYPES)
            made[family] = TinyGGUF(path, config, hf_model)
        return made[family]

    return make
