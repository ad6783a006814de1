"""Compute kernels: each op has a torch reference and a Triton kernel, chosen by device."""

from infer.kernels.activation import gelu_tanh_and_mul, silu_and_mul
from infer.kernels.rms_norm import fused_add_rms_norm, rms_norm

__all__ = [
    "fused_add_rms_norm",
    "gelu_tanh_and_mul",
    "rms_norm",
    "silu_and_mul",
]
