"""Gemma 3 (text): four norms per block, ``(1 + w)`` RMSNorm, GELU-tanh MLP, embeddings
scaled by √hidden, query scale from ``query_pre_attn_scalar``, and sliding-window layers with
their own (local) RoPE base."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from infer.attention import AttentionMetadata
from infer.config import ModelConfig
from infer.distributed.group import ParallelGroup
from infer.kernels import gelu_tanh_and_mul
from infer.models.common import Attention, DecoderModel, GatedMLP, RMSNorm


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, group: ParallelGroup) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = Attention(config, layer_idx, qk_norm=True, norm_offset=1.0, group=group)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, gelu_tanh_and_mul, group)
        self.input_layernorm = RMSNorm(config.hidden_size, eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, offset=1.0)
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, eps, offset=1.0)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps, offset=1.0)

    def forward(
        self,
        x: Tensor,
        residual: Tensor | None,
        meta: AttentionMetadata,
        cos_sin: Tensor,
    ) -> tuple[Tensor, Tensor]:
        h, residual = self.input_layernorm(x, residual)
        h = self.post_attention_layernorm.norm(self.self_attn(h, meta, cos_sin))
        h, residual = self.pre_feedforward_layernorm(h, residual)
        return self.post_feedforward_layernorm.norm(self.mlp(h)), residual


class Gemma3ForCausalLM(DecoderModel):
    norm_offset = 1.0

    def make_layer(self, config: ModelConfig, layer_idx: int, group: ParallelGroup) -> nn.Module:
        return Gemma3DecoderLayer(config, layer_idx, group)

    embed_scale: Tensor

    def init_buffers(self, max_positions: int) -> None:
        super().init_buffers(max_positions)
        # Hugging Face rounds the scale to the weight dtype first; so do we, for parity.
        weight = self.model.embed_tokens.weight
        self.embed_scale = torch.tensor(
            self.config.hidden_size**0.5, dtype=weight.dtype, device=weight.device
        )

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_tokens(input_ids) * self.embed_scale
