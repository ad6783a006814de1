"""Which checkpoint ``quantization_config`` formats load, and the errors naming the rest."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from infer.loader.quantization import (
    FP8Checkpoint,
    dequantize_blocks,
    fp8_checkpoint,
    fp8_tensors,
)

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
def test_fp8_formats_with_tensor_or_channel_scales_load_as_stored(config: dict[str, Any]) -> None:
    assert fp8_checkpoint(config) == FP8Checkpoint(block=None)


def test_block_scaled_fp8_loads_with_its_block_shape() -> None:
    quant = {"quant_method": "fp8", "weight_block_size": [128, 64]}
    assert fp8_checkpoint({**LAYERS, "quantization_config": quant}) == FP8Checkpoint((128, 64))


def test_a_checkpoint_without_quantization_config_is_not_fp8() -> None:
    assert fp8_checkpoint(LAYERS) is None


UNSUPPORTED: list[tuple[dict[str, Any], str]] = [
    ({**LAYERS, "quantization_config": {"quant_method": "awq"}}, "quant_method 'awq'"),
    (compressed(FP8_CHANNEL, format="pack-quantized"), "format 'pack-quantized'"),
    (compressed({**FP8_CHANNEL, "type": "int"}), "weights of type 'int', 8 bits"),
    (compressed({**FP8_CHANNEL, "strategy": "block"}), "strategy 'block'"),
    (compressed({**FP8_CHANNEL, "num_bits": 4}), "4 bits"),
    (
        {**LAYERS, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
        r"weight_block_size \[128\] is not \[rows, columns\]",
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
    kept = [name for name, _ in fp8_tensors(iter([(n, one) for n in names]), FP8Checkpoint())]
    assert kept == [
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.up_proj.weight_scale",
        "model.layers.0.self_attn.k_scale",
        "model.layers.0.self_attn.v_scale",
        "model.layers.0.self_attn.o_proj.weight_scale",
    ]


def test_block_scaled_weights_come_out_dequantised_once_their_scale_came() -> None:
    weight = torch.randn(5, 6).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # blocks of 4 rows x 3 columns
    expected = weight.float() * torch.tensor([[1.0] * 3 + [2.0] * 3] * 4 + [[3.0] * 3 + [4.0] * 3])
    assert torch.equal(dequantize_blocks(weight, scale, (4, 3)), expected)
    stream = [
        ("model.layers.0.mlp.up_proj.weight_scale_inv", scale),  # the scale may come first
        ("model.layers.0.input_layernorm.weight", torch.ones(6)),
        ("model.layers.0.mlp.up_proj.weight", weight),
    ]
    out = list(fp8_tensors(iter(stream), FP8Checkpoint((4, 3))))
    assert [name for name, _ in out] == [
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]
    assert torch.equal(out[1][1], expected)
