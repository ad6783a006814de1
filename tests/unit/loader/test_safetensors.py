"""Hugging Face checkpoint directories: single-file and sharded (index + shards) checkpoints
of every family, Gemma 3's multimodal layout, the progress bar, and an error naming the
tensor or file for each broken checkpoint."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from infer.config import ModelConfig
from infer.loader import load_model, resolve_model
from infer.models import DecoderModel

from .helpers import assert_model_equals

FAMILIES = ("llama", "qwen3", "gemma3")
CPU = torch.device("cpu")


def load(path: Path) -> DecoderModel:
    model, _ = load_model(resolve_model(str(path)), CPU, torch.float32, max_positions=64)
    return model


@pytest.fixture(scope="module")
def sharded(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Callable[[str], Path]
) -> Callable[[str], tuple[Path, dict[str, torch.Tensor]]]:
    """``sharded(family)`` → a checkpoint saved by transformers in several shards with an
    index, and its state dict."""
    from transformers import AutoModelForCausalLM

    made: dict[str, tuple[Path, dict[str, torch.Tensor]]] = {}

    def make(family: str) -> tuple[Path, dict[str, torch.Tensor]]:
        if family not in made:
            model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint(family))
            directory = tmp_path_factory.mktemp(f"sharded-{family}")
            model.save_pretrained(directory, max_shard_size="40KB")
            made[family] = directory, model.state_dict()
        return made[family]

    return make


def shard_of(directory: Path, tensor: str) -> Path:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    return directory / index["weight_map"][tensor]


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_checkpoint(
    family: str, sharded: Callable[[str], tuple[Path, dict[str, torch.Tensor]]]
) -> None:
    directory, state_dict = sharded(family)
    assert len(list(directory.glob("*.safetensors"))) > 3
    assert (directory / "model.safetensors.index.json").is_file()
    model = load(directory)
    assert_model_equals(model, state_dict)
    tied = model.config.tie_word_embeddings
    assert tied == (family != "llama")
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied


@pytest.mark.parametrize("family", FAMILIES)
def test_single_file_checkpoint(family: str, tiny_checkpoint: Callable[[str], Path]) -> None:
    directory = tiny_checkpoint(family)
    assert [p.name for p in directory.glob("*.safetensors")] == ["model.safetensors"]
    assert_model_equals(load(directory), load_file(directory / "model.safetensors"))


def test_bfloat16_checkpoint_loads_into_float32(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    directory = tmp_path / "bf16"
    shutil.copytree(tiny_checkpoint("qwen3"), directory)
    weights = {k: v.bfloat16() for k, v in load_file(directory / "model.safetensors").items()}
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    model = load(directory)
    assert model.lm_head.weight.dtype == torch.float32
    assert_model_equals(model, weights)


def test_loading_shows_progress(
    sharded: Callable[[str], tuple[Path, dict[str, torch.Tensor]]],
    capfd: pytest.CaptureFixture[str],
) -> None:
    directory, state_dict = sharded("llama")
    load(directory)
    err = capfd.readouterr().err
    assert f"Loading {directory.name}" in err and f"/{len(state_dict)} [" in err


# --- Gemma 3's multimodal checkpoints -------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3_multimodal(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Callable[[str], Path]
) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny Gemma3ForConditionalGeneration as transformers saves it, and the state dict
    of its language model under text-model names."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    text = json.loads((tiny_checkpoint("gemma3") / "config.json").read_text())
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    config = Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).eval()
    directory = tmp_path_factory.mktemp("gemma3-mm")
    model.save_pretrained(directory)
    prefix = "model.language_model."
    text_weights = {
        "model." + name[len(prefix) :]: tensor
        for name, tensor in model.state_dict().items()
        if name.startswith(prefix)
    }
    return directory, text_weights


def _native_name(name: str) -> str:
    """The layout transformers >= 4.52 uses in memory (``model.language_model.*`` ...)."""
    if name.startswith("language_model.model."):
        return "model.language_model." + name[len("language_model.model.") :]
    if name.startswith("language_model.lm_head."):
        return name[len("language_model.") :]
    return "model." + name


@pytest.mark.parametrize("layout", ["as saved", "transformers 4.52+ names"])
def test_gemma3_multimodal_checkpoint(
    layout: str, gemma3_multimodal: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    """The language model is loaded, the vision tower and projector are skipped."""
    saved, text_weights = gemma3_multimodal
    directory = saved
    if layout != "as saved":
        directory = tmp_path / "native"
        shutil.copytree(saved, directory)
        weights = load_file(directory / "model.safetensors")
        save_file(
            {_native_name(k): v for k, v in weights.items()},
            directory / "model.safetensors",
            metadata={"format": "pt"},
        )
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert any("vision_tower." in n for n in names)
    assert any("multi_modal_projector." in n for n in names)
    source = resolve_model(str(directory))
    assert source.hf_config["model_type"] == "gemma3"
    model = load(directory)
    assert model.config.model_type == "gemma3_text" and model.config.num_layers == 4
    assert_model_equals(model, text_weights)


# --- broken checkpoints -----------------------------------------------------------------------


def _rewrite(directory: Path, tensor: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the shard holding ``tensor`` after ``change`` edits its tensors."""
    shard = shard_of(directory, tensor)
    weights = load_file(shard)
    change(weights)
    save_file(weights, shard, metadata={"format": "pt"})


def _drop(tensor: str) -> Callable[[Path], None]:
    def change(directory: Path) -> None:
        _rewrite(directory, tensor, lambda weights: weights.pop(tensor))

    return change


def _reshape(tensor: str, shape: tuple[int, ...]) -> Callable[[Path], None]:
    def change(directory: Path) -> None:
        _rewrite(directory, tensor, lambda weights: weights.update({tensor: torch.zeros(shape)}))

    return change


def _add(anchor: str, tensor: str) -> Callable[[Path], None]:
    def change(directory: Path) -> None:
        _rewrite(directory, anchor, lambda weights: weights.update({tensor: torch.zeros(64)}))

    return change


def _delete_shard(directory: Path) -> None:
    shard_of(directory, "model.layers.1.mlp.up_proj.weight").unlink()


BROKEN: dict[str, tuple[Callable[[Path], None], type[Exception], str]] = {
    "missing tensor": (
        _drop("model.layers.1.mlp.up_proj.weight"),
        ValueError,
        r"^tensor model\.layers\.1\.mlp\.up_proj\.weight: missing from the checkpoint",
    ),
    "wrong shape (fused)": (
        _reshape("model.layers.0.self_attn.q_proj.weight", (32, 64)),
        ValueError,
        r"^tensor model\.layers\.0\.self_attn\.q_proj\.weight: checkpoint shape \(32, 64\) "
        r"does not match the model's \(64, 64\)",
    ),
    "wrong shape": (
        _reshape("model.layers.2.self_attn.o_proj.weight", (64, 32)),
        ValueError,
        r"^tensor model\.layers\.2\.self_attn\.o_proj\.weight: checkpoint shape \(64, 32\)",
    ),
    "unexpected tensor": (
        _add("model.norm.weight", "model.layers.0.self_attn.q_proj.bias"),
        ValueError,
        r"^tensor model\.layers\.0\.self_attn\.q_proj\.bias: not a weight of LlamaForCausalLM",
    ),
    "layer beyond the config": (
        _add("model.norm.weight", "model.layers.3.input_layernorm.weight"),
        ValueError,
        r"^tensor model\.layers\.3\.input_layernorm\.weight: not a weight",
    ),
    "missing shard": (
        _delete_shard,
        FileNotFoundError,
        r"shard model-\d+-of-\d+\.safetensors listed in the index",
    ),
    "no config.json": (
        lambda directory: (directory / "config.json").unlink(),
        FileNotFoundError,
        r"has no config\.json",
    ),
    "no weights": (
        lambda directory: [p.unlink() for p in directory.glob("model*")],
        FileNotFoundError,
        r"has no \*\.safetensors weights",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_checkpoint_names_the_tensor_or_file(
    case: str,
    sharded: Callable[[str], tuple[Path, dict[str, torch.Tensor]]],
    tmp_path: Path,
) -> None:
    change, error, message = BROKEN[case]
    directory = tmp_path / "checkpoint"
    shutil.copytree(sharded("llama")[0], directory)
    change(directory)
    with pytest.raises(error, match=message):
        load(directory)


@pytest.mark.parametrize(
    ("config_eos", "generation_eos", "stop_ids"),
    [
        (151645, [151645, 151643], (151645, 151643)),  # Qwen3: <|endoftext|> only here
        ([128001, 128008], 128009, (128001, 128008, 128009)),
        (None, [1, 106], (1, 106)),
        (2, None, (2,)),
    ],
)
def test_stop_tokens_include_generation_config(
    config_eos: int | list[int] | None,
    generation_eos: int | list[int] | None,
    stop_ids: tuple[int, ...],
    tiny_checkpoint: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    """The end-of-turn ids listed in generation_config.json stop generation as they do in
    transformers, together with config.json's."""
    config = json.loads((tiny_checkpoint("qwen3") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": config_eos}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    source = resolve_model(str(tmp_path))
    assert ModelConfig.from_hf_dict(source.hf_config).eos_token_ids == stop_ids


def test_without_generation_config_stop_tokens_are_config_json_s(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    config = json.loads((tiny_checkpoint("qwen3") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": [5, 6]}))
    assert ModelConfig.from_hf_dict(resolve_model(str(tmp_path)).hf_config).eos_token_ids == (
        5,
        6,
    )
