"""How much memory a model's KV cache and weights take, read from the model's config.

A token's K and V occupy ``2 × kv_heads × head_dim × dtype bytes`` in every layer. Layers
with a sliding window (Gemma 3's local layers) only ever attend to the last ``window``
tokens, so a cache that drops blocks outside the window keeps them for those layers only;
the footprint records which layers those are. Only the configuration is read (weights are
counted on the ``meta`` device), so planning for a 70B model needs no GPU and no download
beyond what ``--model`` resolution itself needs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from infer.config import EngineConfig, ModelConfig
from infer.loader import resolve_model
from infer.models import model_class
from infer.models.parallel_layers import ParallelLinear

LAB_MODEL = "lab"
# Lab 0.3's model: 32 heads × 128 dim in bfloat16, K and V counted once per token (the lab
# leaves layers and weights out: "2 × 32 × 128 × 2 bytes = 16 KB" per token).
_LAB = {"num_layers": 1, "num_kv_heads": 32, "head_dim": 128}
# The lab's block-sparse attention reads a window of 4 blocks (``window_blocks=4``).
LAB_WINDOW_BLOCKS = 4


@dataclass(frozen=True)
class KVFootprint:
    """KV-cache and weight sizes of one model at one dtype."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    weight_params: int
    window_layers: int = 0  # layers whose K/V is only needed for the last ``window`` tokens
    window: int = 0  # tokens; 0 when no layer has a sliding window
    kv_dtype_bytes: int = 0  # bytes of a cached K/V element; 0: ``dtype_bytes`` (auto)
    fp8_params: int = 0  # of ``weight_params``, those held in FP8 (``--quantization fp8``)
    fp8_rows: int = 0  # their output rows, each with a float32 scale

    @property
    def layer_bytes_per_token(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * (self.kv_dtype_bytes or self.dtype_bytes)

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token in every layer (layers × KV heads × head dim × 2 × dtype)."""
        return self.num_layers * self.layer_bytes_per_token

    @property
    def full_layers(self) -> int:
        return self.num_layers - self.window_layers

    @property
    def weight_bytes(self) -> int:
        """Weights at ``dtype``, FP8 projections at one byte a weight and four a row."""
        unquantised = self.weight_params - self.fp8_params
        return unquantised * self.dtype_bytes + self.fp8_params + 4 * self.fp8_rows

    def block_bytes(self, block_size: int) -> int:
        return block_size * self.bytes_per_token

    def with_window(self, window: int | None, block_size: int) -> KVFootprint:
        """The footprint the ``paged+window`` strategy sees.

        A model with sliding-window layers keeps its own layers and window (``window``
        overrides the window's size). A model without them is treated as if every layer
        attended to a window (the lab's block-sparse attention), of ``window`` tokens or,
        by default, the lab's 4 blocks.
        """
        if window is not None and window < 1:
            raise ValueError(f"window: must be >= 1 token, got {window}")
        if self.window_layers:
            return replace(self, window=window or self.window)
        return replace(
            self, window_layers=self.num_layers, window=window or LAB_WINDOW_BLOCKS * block_size
        )


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (``ValueError`` naming ``dtype`` if unknown)."""
    return EngineConfig(dtype=dtype).torch_dtype.itemsize


def footprint_of_config(
    name: str, config: ModelConfig, dtype: str, quantization: str | None = None
) -> KVFootprint:
    """The footprint of an architecture; weights are counted on the ``meta`` device. With
    ``quantization="fp8"`` the decoder projections count as FP8 (as the engine holds them)."""
    with torch.device("meta"):
        model = model_class(config)(config)
    projections = [m for m in model.model.layers.modules() if isinstance(m, ParallelLinear)]
    fp8 = quantization == "fp8"
    windows = [config.window_of_layer(i) for i in range(config.num_layers)]
    return KVFootprint(
        name=name,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype_bytes=dtype_bytes(dtype),
        weight_params=sum(p.numel() for p in model.parameters()),
        window_layers=sum(1 for w in windows if w),
        window=max(windows),
        fp8_params=sum(m.weight.numel() for m in projections) if fp8 else 0,
        fp8_rows=sum(m.out_features for m in projections) if fp8 else 0,
    )


def load_footprint(
    model: str,
    dtype: str = "bfloat16",
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
) -> KVFootprint:
    """Footprint of ``--model``: ``lab`` (the lab's 16 KB-per-token model, no weights), or
    anything the engine accepts (built-in name, ``.gguf`` file, HF directory, Hub id);
    ``kv_cache_dtype`` and ``quantization`` as the engine's (``fp8``: one byte per cached
    element, or per weight of a decoder projection)."""
    # ValueError naming the flag
    EngineConfig(kv_cache_dtype=kv_cache_dtype, quantization=quantization, device="cpu")
    kv_bytes = torch.float8_e4m3fn.itemsize if kv_cache_dtype == "fp8" else 0
    if model == LAB_MODEL:
        lab = KVFootprint(LAB_MODEL, dtype_bytes=dtype_bytes(dtype), weight_params=0, **_LAB)
        return replace(lab, kv_dtype_bytes=kv_bytes)
    source = resolve_model(model)
    config = ModelConfig.from_hf_dict(source.hf_config)
    footprint = footprint_of_config(source.name, config, dtype, quantization)
    return replace(footprint, kv_dtype_bytes=kv_bytes)
