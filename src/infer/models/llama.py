"""Llama 3.x (and SmolLM2): pre-norm decoder, SiLU-gated MLP, optional llama3 RoPE scaling."""

from __future__ import annotations

from torch import Tensor, nn

from infer.attention import AttentionMetadata
from infer.config import ModelConfig
from infer.distributed.group import ParallelGroup
from infer.kernels import silu_and_mul
from infer.models.common import Attention, DecoderModel, GatedMLP, RMSNorm


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_idx: int, group: ParallelGroup, qk_norm: bool = False
    ) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx, qk_norm=qk_norm, norm_offset=0.0, group=group)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, silu_and_mul, group)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: Tensor,
        residual: Tensor | None,
        meta: AttentionMetadata,
        cos_sin: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Takes the previous layer's output and the running residual (added here, fused)."""
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, meta, cos_sin)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(DecoderModel):
    def make_layer(self, config: ModelConfig, layer_idx: int, group: ParallelGroup) -> nn.Module:
        return LlamaDecoderLayer(config, layer_idx, group)
