"""FP8 checkpoints: which ``quantization_config`` formats load as they are, and how their
tensors map onto the model's FP8 projections.

Two formats hold FP8 (e4m3) weights with a scale per tensor or per output channel:

- ``quant_method: "compressed-tensors"``, ``format: "float-quantized"`` (the ``*-FP8`` and
  ``*-FP8-dynamic`` checkpoints of llm-compressor): ``*.weight`` and ``*.weight_scale``;
- ``quant_method: "fp8"`` (AutoFP8, transformers' FP8 config): ``*.weight`` and
  ``*.weight_scale`` or ``*.weight_scale_inv`` (the same multiplier, DeepSeek's name).

Those load bit for bit. ``quant_method: "fp8"`` with ``weight_block_size`` (a scale per
block, Qwen3's and DeepSeek's ``*-FP8``) loads too, but not as stored: each weight is
dequantised by its blocks' scales and quantised again per output channel, a second
rounding, until the matmul takes block scales (a GPU session's work).

Activations are always scaled per token at run time, so a checkpoint's static
``input_scale`` is not needed and is dropped. KV-cache scales (``self_attn.k_scale`` and
``v_scale``, or the older ``k_proj.output_scale`` and ``v_proj.output_scale``) load as the
per-tensor scales of an FP8 KV cache. Anything else (integer or FP4 formats, block-wise or
grouped scales, projections left unquantised) is refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from infer.models.parallel_layers import CheckpointTensor

KV_SCALE_SUFFIXES = (".self_attn.k_scale", ".self_attn.v_scale")
_KV_SCALE_ALIASES = {
    ".self_attn.k_proj.output_scale": ".self_attn.k_scale",
    ".self_attn.v_proj.output_scale": ".self_attn.v_scale",
}
_PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
_LAYER_PREFIXES = ("model.layers", "model.language_model.layers", "language_model.model.layers")
_PROJECTION_NAMES = {projection.split(".")[1] for projection in _PROJECTIONS}


@dataclass(frozen=True)
class FP8Checkpoint:
    """How an FP8 checkpoint scales its weights: per tensor or channel (``block`` None,
    loaded as stored), or per ``block`` of (rows, columns) (re-quantised at load)."""

    block: tuple[int, int] | None = None


def fp8_checkpoint(hf_config: dict[str, Any]) -> FP8Checkpoint | None:
    """The checkpoint's FP8 format, None if it declares no quantisation; ``ValueError``
    naming the format when its ``quantization_config`` is one we cannot load."""
    quant = hf_config.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method")
    _check_kv_cache_scheme(quant)
    if method == "compressed-tensors":
        _check_compressed_tensors(quant)
        unquantised = quant.get("ignore") or []
    elif method == "fp8":
        _check_fp8(quant)
        unquantised = quant.get("ignored_layers") or quant.get("modules_to_not_convert") or []
    else:
        raise ValueError(
            f"quantization_config: quant_method {method!r} is not supported "
            "(FP8 checkpoints: 'compressed-tensors' float-quantized, or 'fp8')"
        )
    _check_unquantised(unquantised, hf_config)
    block = quant.get("weight_block_size") if method == "fp8" else None
    return FP8Checkpoint(None if block is None else (int(block[0]), int(block[1])))


def fp8_tensors(
    tensors: Iterator[tuple[str, CheckpointTensor]], fmt: FP8Checkpoint
) -> Iterator[tuple[str, CheckpointTensor]]:
    """An FP8 checkpoint's tensors under the names the model loads: ``weight_scale_inv``
    as ``weight_scale``, KV scales as ``self_attn.k_scale`` / ``v_scale``, activation
    scales left out; block-scaled weights dequantised (float32), their scales consumed."""
    pending: dict[str, Tensor] = {}  # a block-scaled weight or its scale, until both came
    for name, tensor in tensors:
        if name.endswith(".input_scale"):
            continue
        if name.endswith(".weight_scale_inv"):
            name = name.removesuffix("_inv")
        if fmt.block is not None and _is_projection(name):
            weight_name = name.removesuffix("_scale")
            pending[name] = torch.as_tensor(tensor[...])
            if {weight_name, weight_name + "_scale"} <= pending.keys():
                weight, scale = pending.pop(weight_name), pending.pop(weight_name + "_scale")
                yield weight_name, dequantize_blocks(weight, scale, fmt.block)
            continue
        for alias, kv_name in _KV_SCALE_ALIASES.items():
            if name.endswith(alias):
                name = name.removesuffix(alias) + kv_name
        yield name, tensor


def _check_compressed_tensors(quant: dict[str, Any]) -> None:
    fmt = quant.get("format")
    if fmt != "float-quantized":
        raise ValueError(
            f"quantization_config: compressed-tensors format {fmt!r} is not supported "
            "(only 'float-quantized', FP8 weights)"
        )
    for group_name, group in (quant.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        scheme = (weights.get("type"), weights.get("num_bits"), weights.get("strategy"))
        if scheme[:2] != ("float", 8) or scheme[2] not in ("tensor", "channel"):
            raise ValueError(
                f"quantization_config: config group {group_name!r} has weights of type "
                f"{scheme[0]!r}, {scheme[1]} bits, strategy {scheme[2]!r}; supported: "
                "float, 8 bits, strategy 'tensor' or 'channel'"
            )
        activations = group.get("input_activations")
        if activations is not None and (activations.get("type"), activations.get("num_bits")) != (
            "float",
            8,
        ):
            raise ValueError(
                f"quantization_config: config group {group_name!r} has input activations "
                f"of type {activations.get('type')!r}, {activations.get('num_bits')} bits; "
                "supported: float, 8 bits"
            )


def dequantize_blocks(weight: Tensor, scale: Tensor, block: tuple[int, int]) -> Tensor:
    """``weight [N, K]`` times the scale of its ``block`` (``scale [ceil(N/bn), ceil(K/bk)]``),
    in float32."""
    rows, columns = weight.shape
    per_element = scale.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return weight.float() * per_element[:rows, :columns]


def _is_projection(name: str) -> bool:
    """A decoder projection's ``weight`` or ``weight_scale``."""
    parts = name.split(".")
    return parts[-1] in ("weight", "weight_scale") and parts[-2] in _PROJECTION_NAMES


def _check_kv_cache_scheme(quant: dict[str, Any]) -> None:
    scheme = quant.get("kv_cache_scheme")
    if scheme is None:
        return
    kind = (scheme.get("type"), scheme.get("num_bits"), scheme.get("strategy", "tensor"))
    if kind != ("float", 8, "tensor"):
        raise ValueError(
            f"quantization_config: kv_cache_scheme of type {kind[0]!r}, {kind[1]} bits, "
            f"strategy {kind[2]!r} is not supported (float, 8 bits, per tensor)"
        )


def _check_fp8(quant: dict[str, Any]) -> None:
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"quantization_config: fp8 fmt {fmt!r} is not supported (only e4m3)")
    block = quant.get("weight_block_size")
    if block is not None and (len(block) != 2 or min(block) < 1):
        raise ValueError(
            f"quantization_config: fp8 weight_block_size {block} is not [rows, columns]"
        )


def _check_unquantised(entries: list[str], hf_config: dict[str, Any]) -> None:
    """Every decoder projection must be FP8 (the LM head and a vision tower may be left
    out): an entry naming or matching one is refused."""
    text = hf_config.get("text_config") or hf_config
    layers = int(text.get("num_hidden_layers", 0))
    names = [
        f"{prefix}.{i}.{proj}"
        for prefix in _LAYER_PREFIXES
        for i in range(layers)
        for proj in _PROJECTIONS
    ]
    for entry in entries:
        if entry.startswith("re:"):
            pattern = re.compile(entry[3:])
            hit = next((n for n in names if pattern.match(n)), None)
        else:
            hit = entry if entry in names else None
        if hit is not None:
            raise ValueError(
                f"quantization_config: ignore entry {entry!r} leaves {hit} unquantised; "
                "mixed FP8 and unquantised projections are not supported"
            )
