"""Where compiled kernels persist between runs: Triton's disk cache, kept under infer's cache
directory (``INFER_CACHE_DIR``, default ``~/.cache/infer``) in ``triton/``, unless
``TRITON_CACHE_DIR`` names another place; FlashAttention-4's (``attention.flash_attn4``) in
``flash_attn4/``, unless its own variables say otherwise. A second start loads each kernel
variant the first one compiled instead of compiling it again."""

from __future__ import annotations

import os
from pathlib import Path

from infer.config import cache_dir

TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
# FlashAttention-4 keeps its kernels in memory unless told to (read when it is imported).
FLASH_ATTN4_CACHE_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
FLASH_ATTN4_CACHE_ON_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"


def use_kernel_cache() -> Path:
    """Point Triton (before it compiles anything: Triton reads the variable at each compile)
    and FlashAttention-4 (before it is imported) at the kernel cache, and return Triton's;
    a variable already set wins. Inherited by the tensor-parallel workers."""
    os.environ.setdefault(FLASH_ATTN4_CACHE_ON_ENV, "1")
    os.environ.setdefault(FLASH_ATTN4_CACHE_ENV, str(cache_dir() / "flash_attn4"))
    configured = os.environ.get(TRITON_CACHE_ENV)
    if configured:
        return Path(configured)
    path = cache_dir() / "triton"
    os.environ[TRITON_CACHE_ENV] = str(path)
    return path
