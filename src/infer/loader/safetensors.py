"""Hugging Face checkpoints: a local directory (sharded or not) or a Hub id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from safetensors import safe_open

_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]


class SafetensorsCheckpoint:
    """A directory with ``config.json`` and ``*.safetensors`` (``model.safetensors.index.json``
    lists the shards of a sharded checkpoint)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        config_path = self.directory / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"{self.directory} has no config.json")
        self.config: dict[str, Any] = json.loads(config_path.read_text())
        # The generation's stop tokens (Qwen3: <|im_end|> and <|endoftext|>) may be listed
        # only in generation_config.json; stopping at any of either file's is what
        # transformers' generate does.
        generation_path = self.directory / "generation_config.json"
        if generation_path.is_file():
            generation = json.loads(generation_path.read_text())
            config_ids = _ids(self.config.get("eos_token_id"))
            added = [i for i in _ids(generation.get("eos_token_id")) if i not in config_ids]
            if added:  # otherwise config.json stays as written
                self.config["eos_token_id"] = list(dict.fromkeys(config_ids + added))

    def shard_files(self) -> list[Path]:
        index = self.directory / "model.safetensors.index.json"
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (self.directory / f).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"{self.directory}: shard {missing[0]} listed in the index is missing"
                )
            return [self.directory / f for f in files]
        found = sorted(self.directory.glob("*.safetensors"))
        if not found:
            raise FileNotFoundError(f"{self.directory} has no *.safetensors weights")
        return found

    def num_tensors(self) -> int:
        total = 0
        for path in self.shard_files():
            with safe_open(str(path), framework="pt") as f:
                total += len(list(f.keys()))
        return total

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """Lazy slices (``get_shape``, ``[...]``): each tensor-parallel rank reads only its
        rows or columns of the file."""
        for path in self.shard_files():
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    yield _strip_wrapper(name), f.get_slice(name)


def _ids(value: int | list[int] | None) -> list[int]:
    """A token-id field of a config file (one id, a list, or absent) as a list."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _strip_wrapper(name: str) -> str:
    """Gemma 3's multimodal checkpoints nest the text model under ``language_model``."""
    for prefix in ("language_model.model.", "model.language_model."):
        if name.startswith(prefix):
            return "model." + name[len(prefix) :]
    if name.startswith("language_model.lm_head."):
        return name[len("language_model.") :]
    return name


def download_from_hub(repo_id: str) -> Path:
    """Fetch config, tokenizer and safetensors of a Hub model (cached by huggingface_hub)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise FileNotFoundError(
            f"model {repo_id!r} is not a local path, a .gguf file or a built-in name, and the "
            f"Hugging Face Hub could not provide it ({type(exc).__name__}: {exc}). "
            "Download it where the Hub is reachable and pass the local directory."
        ) from exc
