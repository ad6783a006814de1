"""Float8 e4m3: the format of FP8 weights and of an FP8 KV cache, and the scaled cast into it.

``float8_e4m3fn`` has no infinity: a value past ±448 casts to NaN, so every cast clamps.
"""

from __future__ import annotations

import torch
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# An all-zero row gets this scale instead of 0, so quantising it divides by something.
MIN_SCALE = 1e-12
# A row's scale is its largest magnitude times this: CUDA's torch divides by a number that
# way, so the Triton quantisation and torch agree bit for bit on every device.
INVERSE_FP8_MAX = 1.0 / FP8_MAX


def to_fp8(x: Tensor, scale: float | Tensor) -> Tensor:
    """``x / scale`` clamped to ±448 and cast to FP8 (``x ≈ result * scale``)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def indexable(x: Tensor) -> Tensor:
    """``x`` itself, or an FP8 tensor's bytes as ``uint8``: indexed reads and writes of
    float8 are not implemented on every device, and its bytes copy alike."""
    return x.view(torch.uint8) if x.dtype == FP8 else x
