"""Chooses Triton or torch for an op from the tensor it runs on (no flags, no isinstance)."""

from __future__ import annotations

import importlib.util
import os

import torch

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None


def triton_enabled(device: torch.device) -> bool:
    """Triton on CUDA when installed; the torch reference everywhere else.

    ``INFER_DISABLE_TRITON=1`` forces the torch path (to compare the two on a GPU).
    """
    return (
        device.type == "cuda" and TRITON_AVAILABLE and os.environ.get("INFER_DISABLE_TRITON") != "1"
    )


def use_triton(x: torch.Tensor) -> bool:
    """Whether the op on ``x`` runs its Triton kernel (``triton_enabled`` on its device)."""
    return triton_enabled(x.device)
