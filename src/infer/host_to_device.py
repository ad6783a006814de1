"""Per-step host data to the device without waiting for the device.

A copy from ordinary (pageable) host memory is staged by the driver, which may first wait
for the work already queued on the stream: a step launched ahead would then wait for the
step in flight, and async scheduling would be lost. From page-locked memory the copy is
only queued. PyTorch's caching host allocator keeps each page-locked buffer until the copy
that reads it has run, so a buffer per copy is safe and cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def to_device(
    data: Tensor | np.ndarray | Sequence[int] | Sequence[float] | Sequence[Sequence[float]],
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """``data`` as a tensor on ``device``, its copy queued behind the stream's work."""
    host = torch.as_tensor(data, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
    pinned.copy_(host)
    return pinned.to(device, non_blocking=True)
