"""Building blocks shared by the Llama, Qwen3 and Gemma 3 decoders.

Every layer works on the flat token batch ``[T, hidden]`` and reaches the paged KV cache
through ``AttentionMetadata``; which kernels run (torch or Triton) is decided by the ops.
Projections that read the same input are fused (``qkv_proj``, ``gate_up_proj``) so a step
issues fewer, larger matrix multiplications; ``load_weight`` maps Hugging Face names onto them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from infer.attention import AttentionMetadata, attend
from infer.config import ModelConfig, RopeConfig
from infer.distributed.group import SINGLE, ParallelGroup
from infer.kernels import fused_add_rms_norm, rms_norm
from infer.models.parallel_layers import (
    CheckpointTensor,
    ColumnParallelLinear,
    ParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    ShardedModule,
    Split,
    VocabParallelEmbedding,
    copy_checked,
)


class RMSNorm(nn.Module):
    """RMSNorm; ``offset=1`` scales by ``1 + weight`` (Gemma). With ``residual`` it adds first."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim) if offset == 0.0 else torch.zeros(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: Tensor, residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Returns ``(normed, residual_out)``; without a residual, ``residual_out`` is ``x``."""
        if residual is None:
            return rms_norm(x, self.weight, self.eps, self.offset), x
        return fused_add_rms_norm(x, residual, self.weight, self.eps, self.offset)

    def norm(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, self.offset)


def rope_cos_sin_cache(head_dim: int, max_positions: int, rope: RopeConfig) -> Tensor:
    """``[max_positions, head_dim]`` float32 table: cos of each frequency, then sin."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if rope.rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.rope_type == "llama3":
        inv_freq = _llama3_scaled(inv_freq, rope)
    elif rope.rope_type == "yarn":
        inv_freq = _yarn_scaled(inv_freq, head_dim, rope)
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * rope.attention_factor


def _llama3_scaled(inv_freq: Tensor, rope: RopeConfig) -> Tensor:
    """Llama 3.1 frequency scaling: long wavelengths slowed by ``factor``, a smooth band between."""
    low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_scaled(inv_freq: Tensor, head_dim: int, rope: RopeConfig) -> Tensor:
    """YaRN: dimensions that turn many times over the pretrained context keep their
    frequency, those that turn less than once are slowed by ``factor``, a linear ramp between."""

    def dimension_turning(turns: float) -> float:  # the dimension that turns ``turns`` times
        wavelengths = rope.original_max_position_embeddings / (turns * 2 * math.pi)
        return head_dim * math.log(wavelengths) / (2 * math.log(rope.theta))

    low, high = dimension_turning(rope.beta_fast), dimension_turning(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return inv_freq / rope.factor * ramp + inv_freq * (1 - ramp)


class Attention(nn.Module):
    """Self-attention over the paged cache; optional per-head q/k RMSNorm (Qwen3, Gemma 3).

    Under tensor parallelism each rank holds ``num_heads / world`` query heads and their
    KV heads (``kv_heads_per_rank``) and attends over its own share of the pool.
    """

    def __init__(
        self,
        config: ModelConfig,
        layer_idx: int,
        *,
        qk_norm: bool,
        norm_offset: float,
        group: ParallelGroup = SINGLE,
    ):
        super().__init__()
        world = group.world_size
        self.num_heads = config.num_heads // world
        self.num_kv_heads = kv_heads_per_rank(config.num_kv_heads, world)
        self.head_dim = config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q_split = Split(config.num_heads * self.head_dim, world)
        kv_split = Split(config.num_kv_heads * self.head_dim, min(config.num_kv_heads, world))
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size,
            {"q_proj": q_split, "k_proj": kv_split, "v_proj": kv_split},
            bias=config.attention_bias,
            group=group,
        )
        self.o_proj = RowParallelLinear(
            q_split.size, config.hidden_size, bias=config.attention_bias, group=group
        )
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, norm_offset) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, norm_offset) if qk_norm else None
        self.scale = (config.query_pre_attn_scalar or self.head_dim) ** -0.5
        self.sliding_window = config.window_of_layer(layer_idx)
        self.split = (q_size, kv_size, kv_size)
        # Bound by the engine to this layer's slice of the block pool.
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None
        # What an FP8 cache multiplies K and V by: the checkpoint's, else 1 (as vLLM).
        self.kv_scales = (1.0, 1.0)

    def forward(self, x: Tensor, meta: AttentionMetadata, cos_sin: Tensor) -> Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm.norm(q), self.k_norm.norm(k)
        assert self.k_cache is not None and self.v_cache is not None, "KV cache not bound"
        out = attend(
            q,
            k,
            v,
            self.k_cache,
            self.v_cache,
            meta,
            cos_sin=cos_sin,
            scale=self.scale,
            sliding_window=self.sliding_window,
            kv_scales=self.kv_scales,
        )
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused into one projection."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        act: Callable[[Tensor], Tensor],
        group: ParallelGroup = SINGLE,
    ):
        super().__init__()
        split = Split(intermediate, group.world_size)
        self.gate_up_proj = ColumnParallelLinear(
            hidden, {"gate_proj": split, "up_proj": split}, bias=False, group=group
        )
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=False, group=group)
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderStack(nn.Module):
    """The checkpoint's ``model.*`` part: embeddings, decoder layers, final norm."""

    def __init__(
        self, embed_tokens: VocabParallelEmbedding, layers: list[nn.Module], norm: RMSNorm
    ) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.norm = norm

    def attention_layers(self) -> list[Attention]:
        return [cast(Attention, layer.get_submodule("self_attn")) for layer in self.layers]


class DecoderModel(nn.Module):
    """Embedding → decoder layers → final norm → LM head, over a flat token batch.

    Subclasses supply the decoder layer and the family's details (norm offset, embedding
    scale, activation). Parameter names follow Hugging Face checkpoints (``model.*``,
    ``lm_head``) except for the fused projections, which ``load_weight`` resolves.
    """

    norm_offset = 0.0

    rope_global: Tensor
    rope_local: Tensor

    def __init__(self, config: ModelConfig, group: ParallelGroup = SINGLE) -> None:
        super().__init__()
        self.config = config
        self.group = group
        self.model = DecoderStack(
            VocabParallelEmbedding(config.vocab_size, config.hidden_size, group),
            [self.make_layer(config, i, group) for i in range(config.num_layers)],
            RMSNorm(config.hidden_size, config.rms_norm_eps, self.norm_offset),
        )
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, group)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the config ties them (again after
        ``to_empty``, which gives every module its own storage)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def use_fp8_weights(self) -> None:
        """Hold every decoder projection in FP8 (per-channel scales); embeddings, norms and
        the LM head keep the model's dtype. Called before the weights are loaded."""
        for module in self.model.layers.modules():
            if isinstance(module, ParallelLinear):
                module.use_fp8()

    def init_buffers(self, max_positions: int) -> None:
        """Build the RoPE tables (global, and local for Gemma's windowed layers) on the
        weights' device; called once the model's storage exists."""
        device = self.lm_head.weight.device
        config = self.config
        self.rope_global = rope_cos_sin_cache(config.head_dim, max_positions, config.rope).to(
            device
        )
        local = config.local_rope or config.rope
        self.rope_local = rope_cos_sin_cache(config.head_dim, max_positions, local).to(device)

    def make_layer(self, config: ModelConfig, layer_idx: int, group: ParallelGroup) -> nn.Module:
        raise NotImplementedError

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: Tensor, meta: AttentionMetadata) -> Tensor:
        """Hidden states ``[T, hidden]`` after the final norm."""
        hidden = self.embed(input_ids)
        residual: Tensor | None = None
        for layer, attention in zip(self.model.layers, self.model.attention_layers()):
            cos_sin = self.rope_local if attention.sliding_window else self.rope_global
            hidden, residual = layer(hidden, residual, meta, cos_sin)
        hidden, _ = self.model.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """Logits ``[T, vocab]`` in the model's dtype, as the LM head's matmul rounds them
        (on every rank: the LM head gathers them); the sampler widens them only where it
        changes them or reports logprobs, so a step's sampling reads half the bytes."""
        return self.lm_head(hidden)

    def bind_kv_cache(self, k_cache: Tensor, v_cache: Tensor) -> None:
        """Point each layer at its slice of the pool ``[layers, blocks, Hkv, BS, D]``."""
        for i, attention in enumerate(self.model.attention_layers()):
            attention.k_cache = k_cache[i]
            attention.v_cache = v_cache[i]

    _fused: ClassVar[dict[str, str]] = {
        "q_proj": "qkv_proj",
        "k_proj": "qkv_proj",
        "v_proj": "qkv_proj",
        "gate_proj": "gate_up_proj",
        "up_proj": "gate_up_proj",
    }

    def load_weight(self, name: str, tensor: CheckpointTensor) -> bool:
        """Copy (this rank's part of) one checkpoint tensor (HF name) into the model; False
        if the name is unknown."""
        parts = name.split(".")
        shard = parts[-2] if len(parts) >= 3 and parts[-2] in self._fused else None
        path = [*parts[:-2], self._fused[shard]] if shard else parts[:-1]
        try:
            module = self.get_submodule(".".join(path))
        except AttributeError:
            return False
        param = parts[-1]
        if isinstance(module, Attention) and param in ("k_scale", "v_scale"):
            value = float(torch.as_tensor(tensor[...]))
            k, v = module.kv_scales
            module.kv_scales = (value, v) if param == "k_scale" else (k, value)
            return True
        if isinstance(module, ShardedModule):
            module.load(param, tensor, name, shard)
            return True
        target = getattr(module, param, None)
        if not isinstance(target, nn.Parameter):
            return False
        copy_checked(target.data, tensor, name, tuple(target.shape))
        return True

    def expected_weights(self, fp8_scales: bool = False) -> set[str]:
        """HF names the checkpoint must provide (fused projections expanded); with
        ``fp8_scales``, the ``weight_scale`` of every FP8 projection too."""
        names: set[str] = set()
        for param_name, _ in self.named_parameters():
            parts = param_name.split(".")
            module = self.get_submodule(".".join(parts[:-1]))
            params = [parts[-1]]
            scaled = isinstance(module, ParallelLinear) and module.weight_scale is not None
            if fp8_scales and scaled and parts[-1] == "weight":
                params.append("weight_scale")
            if isinstance(module, ColumnParallelLinear):
                prefix = ".".join(parts[:-2])
                names.update(f"{prefix}.{shard}.{p}" for shard in module.shards for p in params)
            else:
                names.update(f"{'.'.join(parts[:-1])}.{p}" for p in params)
        if self.config.tie_word_embeddings:
            names.discard("lm_head.weight")
        return names


def kv_heads_per_rank(num_kv_heads: int, world: int) -> int:
    """KV heads each rank holds: split when they divide over the ranks, else one replicated
    head per rank (the ranks must then divide over the heads)."""
    return max(1, num_kv_heads // world)


def check_tensor_parallel(config: ModelConfig, world: int) -> None:
    """``ValueError`` naming the flag when ``config`` cannot be split over ``world`` ranks."""
    kv = config.num_kv_heads
    problems = [
        f"{config.num_heads} attention heads" if config.num_heads % world else "",
        f"{config.intermediate_size} MLP features" if config.intermediate_size % world else "",
        f"{kv} KV heads" if kv % world and world % kv else "",
    ]
    problem = next((p for p in problems if p), None)
    if problem is not None:
        raise ValueError(
            f"tensor_parallel_size: {world} ranks cannot split the model's {problem} evenly"
        )
