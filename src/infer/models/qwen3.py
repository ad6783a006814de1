"""Qwen3: the Llama decoder with per-head RMSNorm on queries and keys before RoPE."""

from __future__ import annotations

from torch import nn

from infer.config import ModelConfig
from infer.distributed.group import ParallelGroup
from infer.models.common import DecoderModel
from infer.models.llama import LlamaDecoderLayer


class Qwen3ForCausalLM(DecoderModel):
    def make_layer(self, config: ModelConfig, layer_idx: int, group: ParallelGroup) -> nn.Module:
        return LlamaDecoderLayer(config, layer_idx, group, qk_norm=True)
