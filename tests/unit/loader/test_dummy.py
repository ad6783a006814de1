"""``--load-format dummy``: random weights at the exact shapes of a preset or a checkpoint's
config, reproducible for a seed, with identity norms."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from infer import LLM, SamplingParams
from infer.config import ModelConfig
from infer.loader import ModelSource, load_model, resolve_model
from infer.loader.presets import preset_config, preset_names
from infer.models import DecoderModel, model_class
from infer.models.common import RMSNorm
from infer.models.fp8 import quantize_rows
from infer.models.parallel_layers import ParallelLinear

from .helpers import hf_view

CPU = torch.device("cpu")
FAMILIES = ("llama", "qwen3", "gemma3")


def meta_hf_model(raw: dict[str, Any]) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = dict(raw)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(raw.pop("model_type"), **raw))


@pytest.mark.parametrize("name", preset_names())
def test_preset_shapes_are_transformers_shapes(name: str) -> None:
    """Our model for a preset has exactly the parameters (names, shapes, count) that
    transformers builds for the same config; built on the meta device, so no memory."""
    raw = preset_config(name)
    assert raw is not None
    config = ModelConfig.from_hf_dict(raw)
    with torch.device("meta"):
        ours = model_class(config)(config)
    reference = dict(meta_hf_model(raw).named_parameters())
    expected = ours.expected_weights()
    tied_head = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert expected == set(reference) - tied_head
    for weight in sorted(expected):
        assert hf_view(ours, weight).shape == reference[weight].shape, weight
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.values())


def dummy(config: dict[str, Any], seed: int, quantization: str | None = None) -> DecoderModel:
    source = ModelSource("tiny", "preset", config)
    model, _ = load_model(
        source, CPU, torch.float32, 64, load_format="dummy", seed=seed, quantization=quantization
    )
    return model


def test_fp8_dummy_weights_are_the_same_weights_quantised(
    tiny_config: Callable[[str], dict[str, Any]],
) -> None:
    config = tiny_config("llama")
    plain, fp8 = dummy(config, 0), dummy(config, 0, quantization="fp8")
    for name, module in fp8.named_modules():
        if isinstance(module, ParallelLinear):
            assert module.weight_scale is not None
            q, scale = quantize_rows(plain.get_submodule(name).weight)
            assert torch.equal(module.weight.float(), q.float()), name
            assert torch.equal(module.weight_scale, scale), name
    assert torch.equal(fp8.lm_head.weight, plain.lm_head.weight)  # the LM head stays


@pytest.mark.parametrize("family", FAMILIES)
def test_dummy_weights(family: str, tiny_config: Callable[[str], dict[str, Any]]) -> None:
    config = tiny_config(family)
    first, again, other = dummy(config, 0), dummy(config, 0), dummy(config, 1)
    norm_offset = 1.0 if family == "gemma3" else 0.0  # Gemma scales by 1 + w
    matrices = []
    for (name, param), same, different in zip(
        first.named_parameters(), again.parameters(), other.parameters()
    ):
        assert torch.equal(param, same), f"{name} differs for the same seed"
        module = first.get_submodule(name.rsplit(".", 1)[0])
        if isinstance(module, RMSNorm):
            assert torch.all(param + norm_offset == 1.0), f"{name} is not an identity scale"
        else:
            assert not torch.equal(param, different), f"{name} ignores the seed"
            matrices.append(param.flatten())
    values = torch.cat(matrices)
    assert torch.isfinite(values).all()
    assert values.std().item() == pytest.approx(0.02, rel=0.05)
    assert abs(values.mean().item()) < 1e-3


def test_dummy_weights_over_a_checkpoint_directory(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    """A checkpoint's config with ``--load-format dummy``: its shapes, not its weights, and
    (no tokenizer there) prompts as token ids."""
    directory = tiny_checkpoint("llama")
    real, _ = load_model(resolve_model(str(directory)), CPU, torch.float32, 64)
    llm = LLM(
        str(directory),
        load_format="dummy",
        device="cpu",
        num_gpu_blocks=16,
        max_seq_len=64,
        max_batch_size=2,
    )
    assert llm.tokenizer is None
    for (name, random), loaded in zip(llm.engine.model.named_parameters(), real.parameters()):
        assert random.shape == loaded.shape, name
        assert not torch.equal(random, loaded) or "norm" in name, name
    (result,) = llm.generate(
        [[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    tokens = result.outputs[0].token_ids
    assert len(tokens) == 4 and all(0 <= t < 320 for t in tokens)
    assert result.outputs[0].text == ""


def test_preset_without_dummy_is_refused() -> None:
    source = resolve_model("qwen3-0.6b")
    for load_format in ("auto", "safetensors"):
        with pytest.raises(ValueError, match=r"^load_format: .*'qwen3-0\.6b'.*--load-format dummy"):
            load_model(source, CPU, torch.float32, 64, load_format=load_format)
