"""Where compiled kernels persist between runs: Triton's disk cache, kept under infer's cache
directory (``INFER_CACHE_DIR``, default ``~/.cache/infer``) in ``triton/``, unless
``TRITON_CACHE_DIR`` names another place. A second start loads each kernel variant the
first one compiled instead of compiling it again."""

from __future__ import annotations

import os
from pathlib import Path

from infer.config import cache_dir

TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def use_kernel_cache() -> Path:
    """Point Triton at the kernel cache (before it compiles anything: Triton reads the
    variable at each compile) and return it; a ``TRITON_CACHE_DIR`` already set wins."""
    configured = os.environ.get(TRITON_CACHE_ENV)
    if configured:
        return Path(configured)
    path = cache_dir() / "triton"
    os.environ[TRITON_CACHE_ENV] = str(path)  # inherited by the tensor-parallel workers
    return path
