"""Gated activations of the MLP: ``act(gate) * up`` over a fused ``[gate | up]`` input."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from infer.kernels.dispatch import use_triton


def silu_and_mul_torch(x: Tensor) -> Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_torch(x: Tensor) -> Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def silu_and_mul(x: Tensor) -> Tensor:
    if use_triton(x):
        from infer.kernels.activation_triton import silu_and_mul_triton

        return silu_and_mul_triton(x)
    return silu_and_mul_torch(x)


def gelu_tanh_and_mul(x: Tensor) -> Tensor:
    if use_triton(x):
        from infer.kernels.activation_triton import gelu_tanh_and_mul_triton

        return gelu_tanh_and_mul_triton(x)
    return gelu_tanh_and_mul_torch(x)
