"""Programmatic dependent launch (PDL; Hopper and later GPUs): a kernel's programs start while
the kernel before it in the stream is still running, and wait for it only where they need
its results.

At one row a decode step is a chain of a few hundred short kernels, and each would otherwise
pay its launch and its first memory round trip after the one before has ended. A kernel
launched with ``launch_pdl=pdl_mode(x) > 0`` and ``PDL=pdl_mode(x)`` calls
``wait_for_previous_kernel`` before it reads or writes anything another kernel touches (the
wait returns once the kernel before has ended and its writes are visible, which by the same
rule means every kernel before that has ended too). Only reads of what no kernel writes,
such as weights, may come before the wait.

Where the next kernel may launch (``INFER_PDL``): ``early`` (the default) as soon as every
program of this one runs, so a chain of small kernels is resident ahead of its data;
``after`` once this one's wait returns; ``off`` launches without PDL, to measure the
difference on one machine.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

PDL_MODES = {"off": 0, "after": 1, "early": 2}


@functools.cache
def _hopper_or_later(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_mode(x: Tensor) -> int:
    """How kernels on ``x``'s device launch (``PDL_MODES``; read at every launch, so a CUDA
    graph keeps what held when it was captured)."""
    if x.device.type != "cuda":
        return 0
    mode = os.environ.get("INFER_PDL", "early")
    if mode not in PDL_MODES:
        raise ValueError(f"INFER_PDL must be one of {sorted(PDL_MODES)}, not {mode!r}")
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return PDL_MODES[mode] if _hopper_or_later(index) else 0


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """Blocks until the kernel before has ended; lets the next one launch before (``PDL``
    2) or after (1) the wait."""
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL > 0:
        tl.extra.cuda.gdc_wait()
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()
