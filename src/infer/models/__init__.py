"""Model families: Llama 3.x, Qwen3, Gemma 3."""

from infer.models.common import DecoderModel
from infer.models.registry import MODEL_CLASSES, model_class

__all__ = ["MODEL_CLASSES", "DecoderModel", "model_class"]
