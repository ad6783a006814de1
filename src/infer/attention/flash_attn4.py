"""FlashAttention-4's attention kernel (the optional ``flash-attn-4`` package) for long
prompt chunks on Hopper and later.

FlashAttention aligns a causal mask to the bottom right (a chunk's last query sees every key),
so one call covers a chunk after a cached prefix, where cuDNN's mask is aligned to the top
left and ``long_prefill`` splits the chunk in two. The package compiles its kernels with the
CuTe DSL compiler its wheels carry, at the first call of each variant (the engine's warm-up
makes it): no compiler on the machine. How it compares with cuDNN, shape by shape:
``benchmarks/results-by-topic/14-long-context.md``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import threading

import torch
from torch import Tensor


@functools.cache
def flash_attn4_available(device: torch.device) -> bool:
    """Whether long chunks on ``device`` take FlashAttention-4: a GPU of compute capability 9.0
    or later (Hopper, where it was measured) with the package installed."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return False
    try:  # ``flash_attn`` may be FlashAttention-2's package, which has no ``cute``
        return importlib.util.find_spec("flash_attn.cute") is not None
    except ModuleNotFoundError:
        return False


def import_in_background(device: torch.device) -> None:
    """Where long chunks on ``device`` take FlashAttention-4, start importing it in a thread
    of its own: the import takes seconds (its compiler's libraries, and torch's compiler
    stack), which then pass beside the weights' loading; the first call waits for what is
    left (Python's import lock)."""
    if flash_attn4_available(device):
        threading.Thread(
            target=importlib.import_module, args=("flash_attn.cute",),
            name="infer-flash-attn4-import", daemon=True,
        ).start()  # fmt: skip


def causal_attention(
    out: Tensor, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int = 0
) -> None:
    """``q [C, H, D]`` over ``k, v [L, Hkv, D]`` (``L >= C``: the last ``C`` keys are the
    queries' own; ``Hkv`` dividing ``H``), causal, into ``out [C, H, D]``. With a ``window``,
    each query sees only the last ``window`` keys up to its own (Gemma 3's local layers)."""
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError as err:  # installed, but a part of it is missing (its own dependencies)
        raise RuntimeError(
            f"flash-attn-4 is installed but does not import ({err}): reinstall it with its "
            "dependencies, or uninstall it to attend through cuDNN"
        ) from err
    # FlashAttention's window counts the keys left of the query's own: ``window - 1``.
    left = window - 1 if window > 0 else None
    result, _ = flash_attn_func(
        q[None], k[None], v[None], softmax_scale=scale, causal=True, window_size=(left, 0)
    )
    out.copy_(result[0])
