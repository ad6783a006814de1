"""The tensor-parallel group: a rank's place in it and the collectives the model needs.

Two process groups back it: ``compute`` (NCCL on GPUs, gloo on CPU) carries the forward
pass's all-reduces and gathers under a timeout, so a rank that stops answering fails the
step instead of hanging it; ``control`` (gloo, host objects) carries each step's batch from
rank 0 and has no practical timeout, because the other ranks wait on it while the engine is
idle. With one rank every collective is the identity and ``torch.distributed`` is never
initialised (``SINGLE``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

logger = logging.getLogger(__name__)

# A collective of the forward pass that waits longer than this fails the step.
COLLECTIVE_TIMEOUT = timedelta(seconds=float(os.environ.get("INFER_TP_TIMEOUT_S", "300")))
# The other ranks wait for rank 0's next step for as long as the engine stays idle.
IDLE_TIMEOUT = timedelta(days=365)


class WorkerDiedError(RuntimeError):
    """A tensor-parallel rank is gone: no step can run any more."""


@dataclass
class ParallelGroup:
    """One rank of ``world_size``; ``compute``/``control`` are None when it is alone.
    ``check_alive`` (rank 0, local workers) raises ``WorkerDiedError`` for a dead worker."""

    rank: int = 0
    world_size: int = 1
    compute: Any = None
    control: Any = None
    check_alive: Callable[[], None] | None = None

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sum ``x`` over the ranks, in place (the row-parallel layers' partial sums)."""
        if self.world_size > 1:
            dist.all_reduce(x, group=self.compute)
        return x

    def all_gather_last(self, x: Tensor) -> Tensor:
        """Concatenate every rank's ``x`` along the last dimension (vocabulary shards)."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.compute)
        return torch.cat(parts, dim=-1)

    def broadcast_tensor(self, x: Tensor) -> Tensor:
        """Rank 0's ``x`` on every rank (the others pass a buffer of the same shape)."""
        if self.world_size > 1:
            dist.broadcast(x, src=0, group=self.compute)
        return x

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's picklable ``obj`` on every rank (the others pass None)."""
        if self.world_size == 1:
            return obj
        if self.check_alive is not None:
            self.check_alive()  # a dead peer would fail the broadcast less clearly
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest of the ranks' ``value`` (e.g. KV blocks that fit on every device)."""
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.compute)
        return int(tensor.item())


SINGLE = ParallelGroup()


def join_group(
    rank: int, world_size: int, check_alive: Callable[[], None] | None = None
) -> ParallelGroup:
    """Join the control group from the standard environment (``MASTER_ADDR``,
    ``MASTER_PORT``); ``open_compute`` adds the compute group once the device is known.

    Every rank announces itself in the rendezvous store first; rank 0 waits for all of them
    in one-second slices, calling ``check_alive`` between slices, so a worker that dies while
    starting is an error at once rather than a wait for the timeout.
    """
    store = dist.TCPStore(
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=rank == 0,
        timeout=COLLECTIVE_TIMEOUT,
        wait_for_workers=False,  # rank 0 waits below, watching the workers
    )
    store.set(f"infer-rank-{rank}", "up")
    others = [f"infer-rank-{r}" for r in range(1, world_size)]
    deadline = time.monotonic() + COLLECTIVE_TIMEOUT.total_seconds()
    while rank == 0:
        try:
            store.wait(others, timedelta(seconds=1))
            break
        except dist.DistStoreError:
            if check_alive is not None:
                check_alive()
            if time.monotonic() > deadline:
                raise WorkerDiedError(
                    f"tensor-parallel ranks did not join within {COLLECTIVE_TIMEOUT}"
                ) from None
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=IDLE_TIMEOUT
    )
    return ParallelGroup(rank, world_size, None, dist.group.WORLD, check_alive)


def open_compute(group: ParallelGroup, device: torch.device) -> None:
    """Create the compute group: NCCL for CUDA devices, gloo on the CPU (all ranks call it)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    group.compute = dist.new_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)


def close_group(timeout_s: float = 20.0) -> None:
    """Destroy the process groups, giving up after ``timeout_s`` (a wedged NCCL teardown
    is left behind with a warning rather than hanging the process that stops)."""
    if not dist.is_initialized():
        return
    closer = threading.Thread(target=dist.destroy_process_group, daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        logger.warning("the process group did not close within %.0f s; leaving it", timeout_s)
