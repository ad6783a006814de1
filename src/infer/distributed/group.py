"""The tensor-parallel group: a rank's place in it and the collectives the model needs.

Two process groups back it: ``compute`` (NCCL on GPUs, gloo on CPU) carries the forward
pass's all-reduces and gathers under a timeout, so a rank that stops answering fails the
step instead of hanging it; ``control`` (gloo, host objects) carries each step's batch from
rank 0 and has no practical timeout, because the other ranks wait on it while the engine is
idle. With one rank every collective is the identity and ``torch.distributed`` is never
initialised (``SINGLE``).
"""

from __future__ import annotations

import json
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

from infer.distributed.layout import Rendezvous

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


class RendezvousTimeout(TimeoutError):
    """A rank could not reach the master, or rank 0 waited in vain for the others."""


def join_group(
    rank: int,
    world_size: int,
    rendezvous: Rendezvous,
    check_alive: Callable[[], None] | None = None,
    layout: dict[str, str] | None = None,
) -> ParallelGroup:
    """Join the control group at ``rendezvous``; ``open_compute`` adds the compute group
    once the device is known.

    Rank 0 publishes ``layout`` (what every node must agree on) and the others compare
    theirs before they join, so a node started with other flags fails with a clear error
    rather than a hang. Every rank then announces itself in the store; rank 0 waits for all
    of them, calling ``check_alive`` as it polls, so a worker that
    dies while starting is an error at once rather than a wait for the timeout.
    """
    store = _connect(rank, world_size, rendezvous)
    if rank == 0:
        store.set(_LAYOUT_KEY, json.dumps(layout or {}))
    elif layout is not None:
        _check_layout(layout, json.loads(store.get(_LAYOUT_KEY)))
    if store.add(f"infer-rank-{rank}", 1) > 1:
        raise ValueError(
            f"node_rank: rank {rank} has already joined the master at {rendezvous.endpoint}: "
            "two nodes were given the same --node-rank"
        )
    if rank == 0:
        _wait_for_ranks(store, world_size, rendezvous, check_alive)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=IDLE_TIMEOUT
    )
    return ParallelGroup(rank, world_size, None, dist.group.WORLD, check_alive)


_LAYOUT_KEY = "infer-layout"
_POLL_S = 0.1


def _connect(rank: int, world_size: int, rendezvous: Rendezvous) -> dist.Store:
    """Rank 0 hosts the store (unless torchrun's agent does); the others connect to it,
    retrying until the timeout."""
    hosts = rank == 0 and not rendezvous.agent_store
    try:
        store: dist.Store = dist.TCPStore(
            rendezvous.addr,
            rendezvous.port,
            world_size,
            is_master=hosts,
            timeout=timedelta(seconds=rendezvous.timeout_s),
            wait_for_workers=False,  # rank 0 waits in ``_wait_for_ranks``, watching workers
        )
    except dist.DistError as exc:
        if hosts:
            raise ValueError(
                f"master_port: rank 0 cannot listen on {rendezvous.endpoint}: {exc}"
            ) from None
        raise RendezvousTimeout(
            f"dist_timeout: rank {rank} could not reach the master at {rendezvous.endpoint} "
            f"within {rendezvous.timeout_s:g} s (is node 0 started, and are --master-addr "
            f"and --master-port its address and port?): {exc}"
        ) from None
    if rendezvous.agent_store:  # torchrun's store outlives a restart: keys of this attempt
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"infer-{attempt}", store)
    return store


def _listed(noun: str, numbers: list[int]) -> str:
    return f"{noun}{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def _check_layout(mine: dict[str, str], master: dict[str, str]) -> None:
    for name, value in mine.items():
        if master.get(name) != value:
            raise ValueError(
                f"{name}: node 0 runs with {master.get(name)}, this node with {value}; every "
                "node runs the same command but for --node-rank"
            )


def _wait_for_ranks(
    store: dist.Store,
    world_size: int,
    rendezvous: Rendezvous,
    check_alive: Callable[[], None] | None,
) -> None:
    deadline = time.monotonic() + rendezvous.timeout_s
    while True:
        missing = [r for r in range(1, world_size) if not store.check([f"infer-rank-{r}"])]
        if not missing:
            return
        if check_alive is not None:
            check_alive()
        if time.monotonic() > deadline:
            nodes = sorted({r // rendezvous.ranks_per_node for r in missing})
            raise RendezvousTimeout(
                f"dist_timeout: {_listed('rank', missing)} ({_listed('node', nodes)}) did "
                f"not join the master at "
                f"{rendezvous.endpoint} within {rendezvous.timeout_s:g} s; start each other "
                "node with the same command and its --node-rank"
            )
        time.sleep(_POLL_S)  # ``store.wait`` would log a warning each time it times out


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
