"""Per-step host data reaches the device without the host waiting for the device: a step
launched ahead must not wait for the step in flight (``infer.host_to_device``)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from infer.host_to_device import to_device

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SLEEP_CYCLES = 500_000_000  # a few hundred ms of device time on any current GPU


@pytest.mark.parametrize(
    "data", [list(range(256)), np.arange(4096, dtype=np.int64)], ids=["list", "array"]
)
def test_the_copy_is_queued_behind_busy_device_work_without_waiting(data: object) -> None:
    device = torch.device("cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(SLEEP_CYCLES)
    copied = to_device(data, device, torch.int64)  # type: ignore[arg-type]
    queued = time.perf_counter() - start
    torch.cuda.synchronize()
    busy = time.perf_counter() - start
    assert queued < busy / 10, (queued, busy)
    assert torch.equal(copied.cpu(), torch.as_tensor(data, dtype=torch.int64))
