"""What ``--model`` resolves to: the embedded default, a shape preset, a ``.gguf`` file, a
checkpoint directory, or a Hub id (offline here, so a clear error naming it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from infer import LLM
from infer.loader import load_model, resolve_model
from infer.loader.presets import DEFAULT_MODEL, embedded_model_path, preset_config, preset_names

from .conftest import TinyGGUF

CPU = torch.device("cpu")


def test_default_model_is_the_embedded_gguf(smollm2_llm: LLM) -> None:
    source = smollm2_llm.engine.source
    assert DEFAULT_MODEL == "smollm2-135m" and smollm2_llm.config.model == DEFAULT_MODEL
    assert source.kind == "gguf" and source.path == embedded_model_path()
    assert source.path.is_file() and source.tokenizer_path == source.path


@pytest.mark.parametrize("name", preset_names())
def test_preset(name: str) -> None:
    source = resolve_model(name)
    assert (source.kind, source.name, source.path) == ("preset", name, None)
    assert source.hf_config == preset_config(name)
    assert source.tokenizer_path is None


def test_gguf_file(tiny_gguf: Callable[[str], TinyGGUF]) -> None:
    path = tiny_gguf("qwen3").path
    source = resolve_model(str(path))
    assert (source.kind, source.name, source.path) == ("gguf", path.name, path)
    assert source.hf_config["model_type"] == "qwen3"
    assert source.gguf is not None and source.gguf.path == path


def test_a_gguf_file_is_parsed_once_until_it_changes(
    tiny_gguf: Callable[[str], TinyGGUF], tmp_path: Path
) -> None:
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_gguf("llama").path.read_bytes())
    first = resolve_model(str(copy)).gguf
    assert first is not None and resolve_model(str(copy)).gguf is first
    copy.write_bytes(tiny_gguf("qwen3").path.read_bytes())  # another model at the same path
    changed = resolve_model(str(copy))
    assert changed.gguf is not first and changed.hf_config["model_type"] == "qwen3"


def test_missing_gguf_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "absent.gguf"
    with pytest.raises(FileNotFoundError, match=f"{path} does not exist"):
        resolve_model(str(path))


def test_checkpoint_directory(tiny_checkpoint: Callable[[str], Path]) -> None:
    directory = tiny_checkpoint("gemma3")
    source = resolve_model(str(directory))
    assert (source.kind, source.name, source.path) == ("safetensors", directory.name, directory)
    assert source.hf_config == json.loads((directory / "config.json").read_text())
    assert source.tokenizer_path == directory


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path} has no config\.json"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("model", ["./no-such-dir", "no/such/model/path", "not-a-model"])
def test_unknown_name_lists_the_choices(model: str) -> None:
    with pytest.raises(FileNotFoundError, match=rf"model '{model}' is not") as info:
        resolve_model(model)
    assert all(name in str(info.value) for name in [DEFAULT_MODEL, *preset_names()])


def test_existing_file_that_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match=r"is not a \.gguf file"):
        resolve_model(str(path))


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "unreachable endpoint"])
def test_hub_id_offline_names_the_id(
    offline: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """huggingface_hub reads its environment at import, so its constants are patched."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    else:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: closed
    with pytest.raises(FileNotFoundError, match=r"model 'infer-tests/no-such-model' .*Hub"):
        resolve_model("infer-tests/no-such-model")


def test_load_format_must_match_the_source(tiny_checkpoint: Callable[[str], Path]) -> None:
    source = resolve_model(str(tiny_checkpoint("llama")))
    with pytest.raises(ValueError, match=r"^load_format: 'gguf' does not match"):
        load_model(source, CPU, torch.float32, 64, load_format="gguf")
    model, config = load_model(source, CPU, torch.float32, 64, load_format="safetensors")
    assert config.model_type == "llama" and model.config == config
