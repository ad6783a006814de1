"""Which checkpoint ``quantization_config`` formats load, and the errors naming the rest."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from infer.loader.quantization import fp8_checkpoint, fp8_tensors

LAYERS = {"num_hidden_layers": 2}


def compressed(weights: dict[str, Any], **extra: Any) -> dict[str, Any]:
    group = {"targets": ["Linear"], "weights": weights}
    quant = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
        **extra,
    }
    return {**LAYERS, "quantization_config": quant}


FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel"}


@pytest.mark.parametrize(
    "config",
    [
        compressed(FP8_CHANNEL),
        compressed({**FP8_CHANNEL, "strategy": "tensor"}),
        compressed(FP8_CHANNEL, ignore=["lm_head", "re:.*vision_tower.*"]),
        {**LAYERS, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
    ],
    ids=["ct-channel", "ct-tensor", "ct-vision-ignored", "fp8-tensor"],
)
def test_fp8_formats_with_tensor_or_channel_scales_load(config: dict[str, Any]) -> None:
    assert fp8_checkpoint(config)


def test_a_checkpoint_without_quantization_config_is_not_fp8() -> None:
    assert not fp8_checkpoint(LAYERS)


UNSUPPORTED: list[tuple[dict[str, Any], str]] = [
    ({**LAYERS, "quantization_config": {"quant_method": "awq"}}, "quant_method 'awq'"),
    (compressed(FP8_CHANNEL, format="pack-quantized"), "format 'pack-quantized'"),
    (compressed({**FP8_CHANNEL, "type": "int"}), "weights of type 'int', 8 bits"),
    (compressed({**FP8_CHANNEL, "strategy": "block"}), "strategy 'block'"),
    (compressed({**FP8_CHANNEL, "num_bits": 4}), "4 bits"),
    (
        {
            **LAYERS,
            "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        },
        r"weight_block_size \[128, 128\]",
    ),
    ({**LAYERS, "quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, "fmt 'e5m2'"),
    (
        compressed(FP8_CHANNEL, ignore=["lm_head", "model.layers.1.mlp.down_proj"]),
        "ignore entry 'model.layers.1.mlp.down_proj' leaves",
    ),
    (
        compressed(FP8_CHANNEL, kv_cache_scheme={"type": "int", "num_bits": 8}),
        "kv_cache_scheme of type 'int'",
    ),
    (
        compressed(FP8_CHANNEL, ignore=["re:.*self_attn.*"]),
        "leaves model.layers.0.self_attn.q_proj unquantised",
    ),
]


@pytest.mark.parametrize(("config", "message"), UNSUPPORTED, ids=[m for _, m in UNSUPPORTED])
def test_unsupported_formats_are_named(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=rf"^quantization_config: .*{message}"):
        fp8_checkpoint(config)


def test_scales_are_renamed_and_activation_scales_dropped() -> None:
    one = torch.ones(1)
    names = [
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.up_proj.weight_scale_inv",
        "model.layers.0.mlp.up_proj.input_scale",
        "model.layers.0.self_attn.k_scale",
        "model.layers.0.self_attn.v_proj.output_scale",
        "model.layers.0.self_attn.o_proj.weight_scale",
    ]
    kept = [name for name, _ in fp8_tensors(iter([(n, one) for n in names]))]
    assert kept == [
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.up_proj.weight_scale",
        "model.layers.0.self_attn.k_scale",
        "model.layers.0.self_attn.v_scale",
        "model.layers.0.self_attn.o_proj.weight_scale",
    ]
