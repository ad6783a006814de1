"""Shared test setup."""

import os

import torch

# Triton kernels run under the interpreter on CPU-only machines (must be set before import).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
