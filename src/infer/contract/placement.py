"""Where one engine replica of several runs (``server --data-parallel-size``): the API
process decides (``server/bridge/placement.py``), the engine process applies it before it
loads torch (its environment) and when it builds its engine (its rendezvous port)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaPlacement:
    """Replica ``index`` of ``count``: its GPUs (as ``CUDA_VISIBLE_DEVICES`` names them; None:
    the device is the CPU), its torch threads (None: ``OMP_NUM_THREADS`` chose already) and
    its tensor-parallel group's rendezvous port (None: one rank, no group)."""

    index: int
    count: int
    gpus: tuple[str, ...] | None
    cpu_threads: int | None
    master_port: int | None

    def environment(self) -> dict[str, str]:
        """What the engine process sets in its environment before torch reads it."""
        env = {}
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        if self.cpu_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.cpu_threads)
        return env

    def describe(self) -> str:
        return f"replica {self.index} of {self.count}"
