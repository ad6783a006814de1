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
        return self.weight_params * self.dtype_bytes

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


def footprint_of_config(name: str, config: ModelConfig, dtype: str) -> KVFootprint:
    """The footprint of an architecture; weights are counted on the ``meta`` device."""
    with torch.device("meta"):
        model = model_class(config)(config)
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
    )


def load_footprint(
    model: str, dtype: str = "bfloat16", kv_cache_dtype: str = "auto"
) -> KVFootprint:
    """Footprint of ``--model``: ``lab`` (the lab's 16 KB-per-token model, no weights), or
    anything the engine accepts (built-in name, ``.gguf`` file, HF directory, Hub id);
    ``kv_cache_dtype`` as the engine's (``fp8``: one byte per cached element)."""
    EngineConfig(kv_cache_dtype=kv_cache_dtype, device="cpu")  # ValueError naming the flag
    kv_bytes = torch.float8_e4m3fn.itemsize if kv_cache_dtype == "fp8" else 0
    if model == LAB_MODEL:
        lab = KVFootprint(LAB_MODEL, dtype_bytes=dtype_bytes(dtype), weight_params=0, **_LAB)
        return replace(lab, kv_dtype_bytes=kv_bytes)
    source = resolve_model(model)
    config = ModelConfig.from_hf_dict(source.hf_config)
    return replace(footprint_of_config(source.name, config, dtype), kv_dtype_bytes=kv_bytes)
