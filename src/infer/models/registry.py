"""Maps a config's ``model_type`` to its model class."""

from __future__ import annotations

from infer.config import SUPPORTED_MODEL_TYPES, ModelConfig
from infer.models.common import DecoderModel
from infer.models.gemma3 import Gemma3ForCausalLM
from infer.models.llama import LlamaForCausalLM
from infer.models.qwen3 import Qwen3ForCausalLM

MODEL_CLASSES: dict[str, type[DecoderModel]] = {
    "llama": LlamaForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
}


def model_class(config: ModelConfig) -> type[DecoderModel]:
    try:
        return MODEL_CLASSES[config.model_type]
    except KeyError:
        raise ValueError(
            f"unsupported model_type {config.model_type!r}; supported: "
            + ", ".join(SUPPORTED_MODEL_TYPES)
        ) from None
