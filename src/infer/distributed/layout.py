"""Where a process's tensor-parallel ranks sit when the group may span several nodes.

torch.distributed's two conventions both work:

- One process per node (``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``,
  the same command on every node): node ``n`` runs ranks ``n*k`` to ``n*k + k - 1``, ``k``
  being ``tensor_parallel_size / nnodes``; the first in its own process (on node 0, the
  engine), the others in worker processes it starts, local rank ``i`` on ``cuda:i``.
- One process per rank, started by a launcher (torchrun) that sets ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``: each process is its rank and starts none.

Rank 0 hosts the rendezvous store at the master's address and port (unless torchrun's agent
already hosts one there); every other rank must reach it within ``dist_timeout`` seconds.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from infer.config import EngineConfig

DEFAULT_MASTER_PORT = 29500  # torchrun's
_TIMEOUT_ENV = "INFER_DIST_TIMEOUT_S"  # the timeout, for the worker processes a node starts


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet: rank 0's store at ``addr:port``, reached within ``timeout_s``.
    ``agent_store``: torchrun's agent hosts the store, so rank 0 connects to it as well."""

    addr: str
    port: int
    timeout_s: float
    ranks_per_node: int = 1
    agent_store: bool = False

    @property
    def endpoint(self) -> str:
        return f"[{self.addr}]:{self.port}" if ":" in self.addr else f"{self.addr}:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment that hands this rendezvous to a worker process."""
        return {
            "MASTER_ADDR": self.addr,
            "MASTER_PORT": str(self.port),
            _TIMEOUT_ENV: str(self.timeout_s),
            "LOCAL_WORLD_SIZE": str(self.ranks_per_node),
        }

    @classmethod
    def from_env(cls, timeout_s: float | None = None) -> Rendezvous:
        """The rendezvous a launcher (or the node that started this worker) set."""
        if "MASTER_PORT" not in os.environ:
            raise ValueError("master_port: MASTER_PORT is not set for this rank")
        return cls(
            addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            port=int(os.environ["MASTER_PORT"]),
            timeout_s=timeout_s or float(os.environ.get(_TIMEOUT_ENV, "120")),
            ranks_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            agent_store=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )


@dataclass(frozen=True)
class NodeRanks:
    """The ranks one process runs: ``rank`` itself (on ``cuda:local_rank``) and ``spawned``,
    each in a worker process it starts (local ranks ``local_rank + 1``, ...)."""

    world_size: int
    node_rank: int
    rank: int
    local_rank: int
    spawned: tuple[int, ...]
    launched: bool  # one process per rank (torchrun): the launcher started the others

    @property
    def runs_engine(self) -> bool:
        return self.rank == 0

    def local_rank_of(self, rank: int) -> int:
        return self.local_rank + rank - self.rank

    def describe(self) -> str:
        last = self.rank + len(self.spawned)
        ranks = f"rank {self.rank}" if last == self.rank else f"ranks {self.rank}-{last}"
        return f"{ranks} of {self.world_size}"


def launched_rank() -> tuple[int, int] | None:
    """(``RANK``, ``LOCAL_RANK``) when a launcher started this process as one rank of the
    group (``RANK`` and ``WORLD_SIZE`` set, as torchrun does), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank = int(os.environ["RANK"])
    return rank, int(os.environ.get("LOCAL_RANK", rank))


def node_ranks(config: EngineConfig) -> NodeRanks:
    """This process's ranks under ``config`` (and the launcher's environment, if any)."""
    world = config.tensor_parallel_size
    launched = launched_rank()
    if launched is not None:
        if int(os.environ["WORLD_SIZE"]) != world:
            raise ValueError(
                f"tensor_parallel_size: the launcher started WORLD_SIZE={os.environ['WORLD_SIZE']}"
                f" ranks for tensor_parallel_size {world}; with one process per rank they must "
                "be equal (torchrun --nproc-per-node = tensor_parallel_size / nnodes)"
            )
        rank, local_rank = launched
        return NodeRanks(world, config.node_rank, rank, local_rank, (), launched=True)
    per_node = world // config.nnodes
    first = config.node_rank * per_node
    spawned = tuple(range(first + 1, first + per_node))
    return NodeRanks(world, config.node_rank, first, 0, spawned, launched=False)


def rendezvous_for(config: EngineConfig) -> Rendezvous:
    """Where ``config``'s ranks meet. On one node with no port given, a free one (rank 0's
    choice, handed to the workers it starts); across nodes, torchrun's default."""
    per_node = config.tensor_parallel_size // config.nnodes
    if launched_rank() is not None:
        return Rendezvous.from_env(config.dist_timeout)
    port = config.master_port
    if port is None:
        port = DEFAULT_MASTER_PORT if config.nnodes > 1 else _free_port()
    return Rendezvous(config.master_addr, port, config.dist_timeout, per_node)


def layout_of(config: EngineConfig) -> dict[str, str]:
    """What every node must agree on (rank 0 publishes it; the others compare theirs)."""
    return {
        "tensor_parallel_size": str(config.tensor_parallel_size),
        "nnodes": str(config.nnodes),
        "model": config.model,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
