"""GGUF files (llama.cpp): configuration from metadata, tensors dequantised by ``gguf``.

Every tensor type that ``gguf`` can dequantise loads (Q4_K_M files alone mix Q4_K, Q5_0,
Q6_K, Q8_0, ...); a type it cannot is named in the error.

llama.cpp renames tensors, interleaves the rotary halves of Llama's q/k projections and
stores Gemma's norm weights as ``1 + w``; all three are undone here so the model sees
Hugging Face names and layouts.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, GGUFValueType, ReaderTensor
from gguf.quants import dequantize

_GGUF_VERSION = importlib.metadata.version("gguf")
_ARCHES = {"llama": "llama", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GEMMA_LAYER = {**_LAYER, "ffn_norm": "pre_feedforward_layernorm"}
_IGNORED = ("rope_freqs.weight",)  # llama3 frequency table; recomputed from the config


class _Reader(GGUFReader):
    """``GGUFReader`` over a plain array view of its memory map: it parses every metadata
    string (a vocabulary's 100,000s) as a view, and a view of an ``np.memmap`` is a memmap,
    each paying for ``__array_finalize__``. The view keeps the map open."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
        if isinstance(self.data, np.memmap):
            self.data = self.data.view(np.ndarray)  # type: ignore[assignment]
        return super()._get(offset, dtype, count, override_order)


class GGUFFile:
    """An opened GGUF file (memory-mapped)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.reader: GGUFReader = _Reader(self.path)
        arch = self.field("general.architecture")
        if arch not in _ARCHES:
            raise ValueError(
                f"GGUF architecture {arch!r} is not supported; supported: {', '.join(_ARCHES)}"
            )
        self.arch: str = arch

    def field(self, key: str, default: Any = None) -> Any:
        entry = self.reader.fields.get(key)
        if entry is None:
            return default
        types = entry.types
        if len(types) > 1 and types[0] == GGUFValueType.ARRAY and types[1] != GGUFValueType.STRING:
            return list(entry.contents())
        return entry.contents()

    def hf_config(self) -> dict[str, Any]:
        """The metadata expressed as a Hugging Face ``config.json`` dictionary."""
        a = self.arch
        tensors = {t.name: t for t in self.reader.tensors}
        if "token_embd.weight" not in tensors:
            raise ValueError(f"tensor token_embd.weight: missing from {self.path}")
        hidden = int(self.field(f"{a}.embedding_length"))
        heads = int(self.field(f"{a}.attention.head_count"))
        head_dim = int(
            self.field(f"{a}.attention.key_length")
            or self.field(f"{a}.rope.dimension_count", hidden // heads)
        )
        eos = [self.field(f"tokenizer.ggml.{key}") for key in ("eos_token_id", "eot_token_id")]
        config: dict[str, Any] = {
            "model_type": _ARCHES[a],
            "hidden_size": hidden,
            "intermediate_size": int(self.field(f"{a}.feed_forward_length")),
            "num_hidden_layers": int(self.field(f"{a}.block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self.field(f"{a}.attention.head_count_kv", heads)),
            "head_dim": head_dim,
            # The embedding's rows (ggml order is [hidden, vocab]); the tokenizer may be absent.
            "vocab_size": int(tensors["token_embd.weight"].shape[1]),
            "rms_norm_eps": float(self.field(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self.field(f"{a}.rope.freq_base", 10_000.0)),
            "max_position_embeddings": int(self.field(f"{a}.context_length", 8192)),
            "tie_word_embeddings": "output.weight" not in tensors,
            "bos_token_id": self.field("tokenizer.ggml.bos_token_id"),
            "eos_token_id": list(dict.fromkeys(int(e) for e in eos if e is not None)) or None,
        }
        if "rope_freqs.weight" in tensors:
            # llama.cpp keeps Llama 3 scaling only as this table of per-frequency divisors;
            # its largest entry is the factor (the band edges are those of every Llama 3.x).
            divisors = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float32)
            config["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": float(divisors.max()),
                "original_max_position_embeddings": int(
                    self.field(f"{a}.rope.scaling.original_context_length", 8192)
                ),
            }
        elif self.field(f"{a}.rope.scaling.type") == "linear":
            config["rope_scaling"] = {
                "rope_type": "linear",
                "factor": float(self.field(f"{a}.rope.scaling.factor")),
            }
        if a == "gemma3":
            config.update(
                sliding_window=int(self.field(f"{a}.attention.sliding_window", 512)),
                sliding_window_pattern=6,
                rope_local_base_freq=10_000.0,
                query_pre_attn_scalar=_gemma3_query_pre_attn_scalar(config),
                hidden_activation="gelu_pytorch_tanh",
            )
        return config

    def chat_template(self) -> str | None:
        return self.field("tokenizer.chat_template")

    def num_tensors(self) -> int:
        """How many tensors ``tensors`` yields."""
        return sum(t.name not in _IGNORED for t in self.reader.tensors)

    def tensors(self, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, float32 tensor)`` for every weight, dequantised."""
        layer_names = _GEMMA_LAYER if self.arch == "gemma3" else _LAYER
        for tensor in self.reader.tensors:
            if tensor.name in _IGNORED:
                continue
            name = _hf_name(tensor.name, layer_names)
            value = torch.from_numpy(_dequantize(tensor))
            if self.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                value = _unpermute_rotary(value, num_heads if "q_proj" in name else num_kv_heads)
            if self.arch == "gemma3" and name.endswith("norm.weight"):
                value = value - 1.0
            yield name, value


def _gemma3_query_pre_attn_scalar(config: dict[str, Any]) -> int:
    """The attention scale's divisor, which GGUF metadata does not store: llama.cpp knows
    27B (62 layers) as the one size scaled by hidden / heads (5376 / 32 = 168, as its
    config.json says) and every other size by the head dimension (256)."""
    if config["num_hidden_layers"] == 62:
        return int(config["hidden_size"] // config["num_attention_heads"])
    return int(config["head_dim"])


def _dequantize(tensor: ReaderTensor) -> np.ndarray:
    """The tensor's values as float32, by ``gguf``'s dequantisation of its type."""
    try:
        data = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise ValueError(
            f"tensor {tensor.name}: GGUF type {tensor.tensor_type.name} is not supported "
            f"(gguf {_GGUF_VERSION} cannot dequantise it)"
        ) from None
    return np.array(data, dtype=np.float32, order="C")


def _hf_name(gguf_name: str, layer_names: dict[str, str]) -> str:
    if gguf_name in _TOP_LEVEL:
        return _TOP_LEVEL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    raise ValueError(f"tensor {gguf_name}: unknown GGUF tensor name")


def _unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of each head's two rotary halves."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )
