"""FP8 weights end to end on the CPU: tiny checkpoints written in the compressed-tensors
and ``quant_method: "fp8"`` formats load as they are, and ``quantization="fp8"`` on an
unquantised checkpoint computes the same model as its per-channel FP8 checkpoint."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.conftest import FAMILIES

from infer import LLM, SamplingParams
from infer.attention import ScheduledSequence, build_metadata
from infer.loader import load_model, resolve_model
from infer.loader.quantization import dequantize_blocks
from infer.models import DecoderModel
from infer.models.fp8 import FP8, FP8_MAX, quantize_rows

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def compressed_tensors_config(strategy: str) -> dict[str, Any]:
    """What llm-compressor writes for an FP8-dynamic scheme."""
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy},
                "input_activations": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "token",
                    "dynamic": True,
                },
            }
        },
        "ignore": ["lm_head"],
    }


BLOCK = (32, 16)
FORMATS: dict[str, tuple[dict[str, Any], str, str]] = {
    # name: (quantization_config, weight strategy, scale tensor suffix)
    "ct-channel": (compressed_tensors_config("channel"), "channel", "weight_scale"),
    "ct-tensor": (compressed_tensors_config("tensor"), "tensor", "weight_scale"),
    "fp8-tensor": (
        {"quant_method": "fp8", "activation_scheme": "static", "fmt": "e4m3"},
        "tensor",
        "weight_scale_inv",
    ),
    "fp8-block": (
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)},
        "block",
        "weight_scale_inv",
    ),
}
AS_STORED = [fmt for fmt, (_, strategy, _) in FORMATS.items() if strategy != "block"]


def write_fp8_checkpoint(source: Path, target: Path, fmt: str) -> Path:
    """``source``'s checkpoint with every decoder projection in FP8, as ``fmt`` stores it
    (static-activation formats carry an ``input_scale`` the loader must drop)."""
    quant_config, strategy, scale_name = FORMATS[fmt]
    shutil.copytree(source, target)
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "quantization_config": quant_config}))
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        if name.split(".")[-2] not in PROJECTIONS:
            tensors[name] = tensor
            continue
        prefix = name.removesuffix(".weight")
        if strategy == "channel":
            q, scale = quantize_rows(tensor)
            tensors[f"{prefix}.{scale_name}"] = scale.unsqueeze(1)  # [N, 1] as stored
        elif strategy == "block":
            q, scale = quantize_blocks(tensor)
            tensors[f"{prefix}.{scale_name}"] = scale
        else:
            scale = tensor.abs().amax() / FP8_MAX
            q = (tensor / scale).to(FP8)
            tensors[f"{prefix}.{scale_name}"] = scale.reshape(1)
        tensors[name] = q
        if "static" in json.dumps(quant_config):
            tensors[f"{prefix}.input_scale"] = torch.ones(1)
    save_file(tensors, str(target / "model.safetensors"))
    return target


def quantize_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 with a scale per ``BLOCK`` (the shapes here divide into whole blocks)."""
    rows, columns = weight.shape[0] // BLOCK[0], weight.shape[1] // BLOCK[1]
    blocks = weight.reshape(rows, BLOCK[0], columns, BLOCK[1])
    scale = blocks.abs().amax(dim=(1, 3)) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).to(FP8).reshape(weight.shape)
    return q, scale


def prefill_logits(model: DecoderModel, prompt: list[int]) -> torch.Tensor:
    config = model.config
    k = torch.zeros(config.num_layers, 4, config.num_kv_heads, 16, config.head_dim)
    model.bind_kv_cache(k, torch.zeros_like(k))
    ids, meta = build_metadata([ScheduledSequence([0, 1, 2], 0, prompt)], 16, torch.device("cpu"))
    with torch.no_grad():
        return model.compute_logits(model(ids, meta))


def load(path: Path, quantization: str | None = None) -> DecoderModel:
    source = resolve_model(str(path))
    cpu = torch.device("cpu")
    return load_model(source, cpu, torch.float32, 512, quantization=quantization)[0]


PROMPT = list(range(3, 43))


@pytest.mark.parametrize("family", FAMILIES)
def test_channel_checkpoint_is_the_model_quantised_at_load(
    family: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    unquantised = tiny_checkpoint(family)
    checkpoint = write_fp8_checkpoint(unquantised, tmp_path / "fp8", "ct-channel")
    from_checkpoint = load(checkpoint)
    at_load = load(unquantised, quantization="fp8")
    for (name, ours), (_, theirs) in zip(
        from_checkpoint.state_dict().items(), at_load.state_dict().items(), strict=True
    ):
        assert ours.dtype == theirs.dtype and torch.equal(ours.float(), theirs.float()), name
    assert torch.equal(prefill_logits(from_checkpoint, PROMPT), prefill_logits(at_load, PROMPT))


@pytest.mark.parametrize("fmt", AS_STORED)
@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_checkpoints_load_as_stored_and_stay_close_to_the_original(
    family: str, fmt: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    unquantised = tiny_checkpoint(family)
    checkpoint = write_fp8_checkpoint(unquantised, tmp_path / "fp8", fmt)
    model = load(checkpoint)
    stored = load_file(str(checkpoint / "model.safetensors"))
    scale_name = FORMATS[fmt][2]
    qkv = model.model.layers[0].self_attn.qkv_proj
    offset, size = qkv.shard_offsets["k_proj"]
    k_rows = slice(offset, offset + size)
    k_stored = stored["model.layers.0.self_attn.k_proj.weight"]
    assert qkv.weight.dtype == FP8 and model.lm_head.weight.dtype == torch.float32
    assert torch.equal(qkv.weight[k_rows].float(), k_stored.float())
    k_scales = stored[f"model.layers.0.self_attn.k_proj.{scale_name}"].flatten()
    assert torch.equal(qkv.weight_scale[k_rows], k_scales.expand(k_stored.shape[0]))
    ours, original = prefill_logits(model, PROMPT), prefill_logits(load(unquantised), PROMPT)
    # FP8 rounding of weights and activations compounds over random layers (up to ~15 %
    # here); a scale read wrongly (divided, or ignored) is off by orders of magnitude.
    assert (ours - original).norm() / original.norm() < 0.25


@pytest.mark.parametrize("family", FAMILIES)
def test_block_scaled_checkpoints_are_requantised_per_channel(
    family: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    unquantised = tiny_checkpoint(family)
    checkpoint = write_fp8_checkpoint(unquantised, tmp_path / "fp8", "fp8-block")
    model = load(checkpoint)
    stored = load_file(str(checkpoint / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj"
    dequantised = dequantize_blocks(
        stored[f"{name}.weight"], stored[f"{name}.weight_scale_inv"], BLOCK
    )
    q, scale = quantize_rows(dequantised)
    down = model.model.layers[1].mlp.down_proj
    assert torch.equal(down.weight.float(), q.float()) and torch.equal(down.weight_scale, scale)
    ours, original = prefill_logits(model, PROMPT), prefill_logits(load(unquantised), PROMPT)
    assert (ours - original).norm() / original.norm() < 0.25


def test_fp8_checkpoint_generates_what_quantising_at_load_generates(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    unquantised = tiny_checkpoint("llama")
    checkpoint = write_fp8_checkpoint(unquantised, tmp_path / "fp8", "ct-channel")
    prompts = [PROMPT[:7], PROMPT]
    options: dict[str, Any] = {"num_gpu_blocks": 32, "max_seq_len": 128, "max_batch_size": 4}
    ours = LLM(str(checkpoint), **options).generate(prompts, GREEDY, use_tqdm=False)
    at_load = LLM(str(unquantised), quantization="fp8", **options)
    theirs = at_load.generate(prompts, GREEDY, use_tqdm=False)
    assert [r.outputs[0].token_ids for r in ours] == [r.outputs[0].token_ids for r in theirs]


def test_kv_cache_scales_load_as_the_attention_layers_scales(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    checkpoint = write_fp8_checkpoint(tiny_checkpoint("llama"), tmp_path / "fp8", "ct-tensor")
    tensors = load_file(str(checkpoint / "model.safetensors"))
    tensors["model.layers.1.self_attn.k_scale"] = torch.tensor(2.0)
    tensors["model.layers.1.self_attn.v_proj.output_scale"] = torch.tensor([0.5])  # older name
    save_file(tensors, str(checkpoint / "model.safetensors"))
    model = load(checkpoint)
    assert model.model.layers[1].self_attn.kv_scales == (2.0, 0.5)
    assert model.model.layers[0].self_attn.kv_scales == (1.0, 1.0)  # none given: 1


def test_a_missing_scale_is_named(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    checkpoint = write_fp8_checkpoint(tiny_checkpoint("llama"), tmp_path / "fp8", "ct-tensor")
    tensors = load_file(str(checkpoint / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight_scale"]
    save_file(tensors, str(checkpoint / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj.weight_scale: missing"):
        load(checkpoint)


def test_fp8_tensors_without_a_quantization_config_are_refused(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    checkpoint = write_fp8_checkpoint(tiny_checkpoint("qwen3"), tmp_path / "fp8", "ct-tensor")
    config = json.loads((checkpoint / "config.json").read_text())
    del config["quantization_config"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"FP8 weights, but the checkpoint's config\.json"):
        load(checkpoint)
