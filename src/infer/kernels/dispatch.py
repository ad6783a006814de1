"""Chooses Triton or torch for an op from the tensor it runs on (no flags, no isinstance)."""

from __future__ import annotations

import importlib.util
import os

import torch

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None


def use_triton(x: torch.Tensor) -> bool:
    """Triton on CUDA tensors when installed; the torch reference everywhere else.

    ``INFER_DISABLE_TRITON=1`` forces the torch path (to compare the two on a GPU).
    """
    return x.is_cuda and TRITON_AVAILABLE and os.environ.get("INFER_DISABLE_TRITON") != "1"
