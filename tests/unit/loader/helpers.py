"""Helpers for the loader tests: random tiny HF models, llama.cpp-style GGUF files, and our
(fused) parameters seen under Hugging Face names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from infer.config import ModelConfig
from infer.models import DecoderModel
from infer.models.common import ColumnParallelLinear

# Byte offsets of the fp16 super-block scales (d, dmin) inside one K-quant block.
_KQUANT_SCALE_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
GGUF_ARCHES = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
}


def hf_view(model: DecoderModel, name: str) -> torch.Tensor:
    """Our tensor behind the Hugging Face parameter ``name`` (a slice of a fused projection)."""
    parts = name.split(".")
    fused = DecoderModel._fused.get(parts[-2]) if len(parts) >= 3 else None
    if fused is None:
        return model.get_parameter(name).data
    module = model.get_submodule(".".join([*parts[:-2], fused]))
    assert isinstance(module, ColumnParallelLinear)
    start, size = module.shard_offsets[parts[-2]]
    return module.get_parameter(parts[-1]).data[start : start + size]


def assert_model_equals(model: DecoderModel, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Every weight of ``model`` equals the HF ``state_dict``'s, and none is left out."""
    expected = model.expected_weights()
    assert expected <= set(state_dict), sorted(expected - set(state_dict))
    for name in sorted(expected):
        torch.testing.assert_close(
            hf_view(model, name), state_dict[name].float(), msg=name, rtol=0, atol=0
        )


def random_hf_model(config: Mapping[str, Any], seed: int = 0) -> Any:
    """A transformers model of ``config`` with random weights large enough that attention
    is far from uniform (so q/k layouts show in the logits) and random norm scales (so a
    wrong norm convention cannot hide behind all-ones)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = dict(config)
    model_type = raw.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **raw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    norm_mean = 0.0 if model_type == "gemma3_text" else 1.0  # Gemma scales by 1 + w
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(norm_mean, 0.1)
            else:
                param.normal_(0.0, 0.2)
    return model.eval()


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """``convert_hf_to_gguf.py``'s interleaving of the two rotary halves of each head."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_names(config: ModelConfig) -> Callable[[str], str]:
    """HF tensor name → GGUF name, by gguf's own table (the one llama.cpp converts with)."""
    table = gguf.get_tensor_name_map(GGUF_ARCHES[config.model_type], config.num_layers)

    def name(hf_name: str) -> str:
        found = table.get_name(hf_name, try_suffixes=(".weight",))
        assert found is not None, hf_name
        return found

    return name


def to_llama_cpp(
    config: ModelConfig, state_dict: Mapping[str, torch.Tensor]
) -> dict[str, np.ndarray]:
    """What ``convert_hf_to_gguf.py`` stores for an HF state dict: GGUF names, Llama's q/k
    rows permuted, Gemma's norms as ``1 + w``, and no LM head when it is tied."""
    name = gguf_names(config)
    out: dict[str, np.ndarray] = {}
    for hf_name, tensor in state_dict.items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy()
        if config.model_type == "llama" and hf_name.endswith("q_proj.weight"):
            data = llama_cpp_permute(data, config.num_heads)
        elif config.model_type == "llama" and hf_name.endswith("k_proj.weight"):
            data = llama_cpp_permute(data, config.num_kv_heads)
        if config.is_gemma and hf_name.endswith("norm.weight"):
            data = data + 1.0
        out[name(hf_name)] = np.ascontiguousarray(data)
    return out


def random_kquant_bytes(rows: int, cols: int, qtype: Q, seed: int = 0) -> np.ndarray:
    """Valid K-quant blocks (random quants and sub-scales, small positive fp16 super-block
    scales), for the types ``gguf.quants.quantize`` cannot produce."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    assert cols % block == 0, f"{qtype.name} rows need a multiple of {block} values"
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // block, type_size), dtype=np.uint8)
    for offset in _KQUANT_SCALE_OFFSETS[qtype]:
        scale = rng.uniform(1e-5, 1e-4, size=raw.shape[:2]).astype(np.float16)
        raw[:, :, offset : offset + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def random_blocks(rows: int, cols: int, qtype: Q, seed: int = 0) -> np.ndarray:
    """Random stored bytes of any type, every byte below 0x7C so that no fp16, bf16, fp8 or
    e8m0 scale inside a block is an infinity or NaN."""
    shape = gguf.quants.quant_shape_to_byte_shape((rows, cols), qtype)
    return np.random.default_rng(seed).integers(0, 0x7C, size=shape, dtype=np.uint8)


def encode(data: np.ndarray, qtype: Q, seed: int = 0) -> np.ndarray:
    """What a GGUF file stores for ``data`` as ``qtype``: gguf's quantisation where it has
    one, else random blocks (small-scaled ones for the K-quants)."""
    if qtype == Q.F32:
        return data.astype(np.float32)
    if qtype == Q.F16:
        return data.astype(np.float16)
    if qtype in _KQUANT_SCALE_OFFSETS:
        return random_kquant_bytes(data.shape[0], data.shape[1], qtype, seed)
    try:
        return gguf.quants.quantize(data.astype(np.float32), qtype)
    except NotImplementedError:
        return random_blocks(data.shape[0], data.shape[1], qtype, seed)


def write_gguf(
    path: Path,
    config: ModelConfig,
    tensors: Mapping[str, np.ndarray],
    types: Mapping[str, Q] | None = None,
    arch: str | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """A GGUF file with the metadata keys llama.cpp writes for ``config`` (no tokenizer);
    ``extra`` may add more keys."""
    arch = arch or gguf.MODEL_ARCH_NAMES[GGUF_ARCHES[config.model_type]]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope.theta)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    if config.model_type == "llama":
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(config.head_dim)
    if config.sliding_window is not None:
        writer.add_sliding_window(config.sliding_window)
    if config.bos_token_id is not None:
        writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_ids[0])
    if extra is not None:
        extra(writer)
    types = types or {}
    for i, (name, data) in enumerate(tensors.items()):
        qtype = types.get(name, Q.F32)
        stored = encode(data, qtype, seed=i)
        writer.add_tensor(name, stored, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
