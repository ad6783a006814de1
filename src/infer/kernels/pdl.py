"""Programmatic dependent launch (PDL; Hopper and later GPUs): a kernel's programs start while
the kernel before it in the stream is still running, and wait for it only where they need
its results.

At one row a decode step is a chain of a few hundred short kernels, and each would otherwise
pay its launch and its first memory round trip after the one before has ended. A kernel
launched with ``**pdl_launch(x)`` (the launch option and its ``PDL`` constexpr) calls
``wait_for_previous_kernel`` before it reads or writes anything another kernel touches (the
wait returns once the kernel before has ended and its writes are visible, which by the same
rule means every kernel before that has ended too), then lets the next kernel launch.
Only reads of what no kernel writes, such as weights, may come before the wait.

``INFER_DISABLE_PDL=1`` launches without it, to measure the difference on one machine.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor


@functools.cache
def _hopper_or_later(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_enabled(x: Tensor) -> bool:
    """Whether kernels on ``x``'s device launch with PDL (read at every launch, so a CUDA
    graph keeps what held when it was captured)."""
    if x.device.type != "cuda" or os.environ.get("INFER_DISABLE_PDL") == "1":
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _hopper_or_later(index)


def pdl_launch(x: Tensor) -> dict[str, bool]:
    """A launch's keywords for kernels on ``x``'s device: the ``PDL`` constexpr and Triton's
    ``launch_pdl`` option, which must agree."""
    enabled = pdl_enabled(x)
    return {"PDL": enabled, "launch_pdl": enabled}


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """Blocks until the kernel before has ended, then lets the next one launch: after the
    wait, so at most two kernels' programs are resident at a time (letting it launch before
    the wait was slower on an H100: benchmarks/results-by-topic/11-fp8.md, 11.8)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
