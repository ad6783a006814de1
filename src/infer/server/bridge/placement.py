"""Where each engine replica of ``--data-parallel-size N`` runs on this host.

Replica ``i`` gets GPUs ``i*tp`` to ``i*tp + tp - 1`` of those visible (``tp`` being
``tensor_parallel_size``; the visible ones are ``CUDA_VISIBLE_DEVICES``'s, or the machine's),
which its engine process sees as ``cuda:0`` to ``cuda:tp-1``; its tensor-parallel group
meets on a port of its own; its torch threads are its share of the cores. Torch-free: the
API process decides, each engine process checks that its GPUs are there
(``engine/process.py``) and the API process that they all found the same device.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from contextlib import ExitStack

from infer.config import EngineConfig
from infer.contract.placement import ReplicaPlacement


def check_layout(
    replicas: int, config: EngineConfig, environ: Mapping[str, str] = os.environ
) -> None:
    """``ValueError`` naming the setting when ``replicas`` copies of ``config``'s engine
    cannot share this host."""
    if replicas < 1:
        raise ValueError(f"data_parallel_size: must be >= 1, got {replicas}")
    if replicas == 1:
        return
    if config.nnodes > 1:
        raise ValueError(
            "data_parallel_size: replicas share one host; for replicas that span nodes, run "
            "a server per group of nodes and `infer router` in front of them"
        )
    device = config.device or ""
    if ":" in device:
        raise ValueError(
            f"device: each replica takes its own GPUs (cuda:0, ... of its share); leave it "
            f"as 'cuda' with data_parallel_size {replicas}, got {device!r}"
        )
    visible = visible_gpus(environ)
    needed = replicas * config.tensor_parallel_size
    if device == "cuda" and visible is not None and len(visible) < needed:
        raise ValueError(
            f"data_parallel_size: {replicas} replicas of tensor_parallel_size "
            f"{config.tensor_parallel_size} need {needed} GPUs, but CUDA_VISIBLE_DEVICES "
            f"names {len(visible)}"
        )


def place_replicas(
    replicas: int,
    config: EngineConfig,
    environ: Mapping[str, str] = os.environ,
    cores: int | None = None,
) -> list[ReplicaPlacement] | None:
    """Each replica's placement (see the module's docstring); None for a single engine,
    which runs as it always did. ``cores``: this host's (default: those this process may
    use)."""
    check_layout(replicas, config, environ)
    if replicas == 1:
        return None
    per_replica = config.tensor_parallel_size
    visible = visible_gpus(environ)
    threads = None
    if "OMP_NUM_THREADS" not in environ:
        cores = cores or len(os.sched_getaffinity(0))
        threads = max(1, cores // (replicas * per_replica))
    ports: list[int | None] = [None] * replicas
    if per_replica > 1:
        ports = list(_group_ports(replicas, config))
    placements = []
    for index in range(replicas):
        first = index * per_replica
        gpus = None
        if config.device != "cpu":
            names = [str(i) for i in range(first + per_replica)] if visible is None else visible
            gpus = tuple(names[first : first + per_replica])
        placements.append(ReplicaPlacement(index, replicas, gpus, threads, ports[index]))
    return placements


def visible_gpus(environ: Mapping[str, str] = os.environ) -> list[str] | None:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` names, in its order; None when it is not set."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _group_ports(replicas: int, config: EngineConfig) -> list[int]:
    """A rendezvous port per replica's tensor-parallel group: ``master_port``, the next
    one, ...; or free ones, all different (held open together while they are picked)."""
    if config.master_port is not None:
        last = config.master_port + replicas - 1
        if last > 65535:
            raise ValueError(
                f"master_port: replica i meets on master_port + i, and {last} is no port"
            )
        return list(range(config.master_port, last + 1))
    with ExitStack() as held:
        ports = []
        for _ in range(replicas):
            sock = held.enter_context(socket.socket())
            sock.bind((config.master_addr, 0))
            ports.append(int(sock.getsockname()[1]))
    return ports
