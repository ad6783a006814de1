"""A node other than node 0: its tensor-parallel ranks, headless.

``infer serve`` (or ``infer generate``) with ``--node-rank N`` > 0, or started by torchrun as
a rank other than 0, serves no API: it runs its first rank in its own process and starts the
others as workers (``tp_worker.py``), then follows rank 0's steps until rank 0 sends the
shutdown step (exit 0) or the group's connection breaks because node 0 went away (exit 1).
"""

from __future__ import annotations

import logging
import os

from infer.config import EngineConfig, ModelConfig
from infer.distributed.group import WorkerDiedError
from infer.distributed.layout import layout_of, node_ranks, rendezvous_for
from infer.engine.setup.tp_worker import check_devices, run_rank, spawn_workers
from infer.loader import resolve_model
from infer.models.common import check_tensor_parallel

logger = logging.getLogger(__name__)


def serve_node(config: EngineConfig) -> int:
    """Run this process's ranks of ``config`` until rank 0 is done; the exit status."""
    ranks = node_ranks(config)
    if ranks.runs_engine:
        raise ValueError("node_rank: node 0 runs the engine (infer serve), not headless ranks")
    source = resolve_model(config.model)  # on this node: its config, before any weights
    check_tensor_parallel(ModelConfig.from_hf_dict(source.hf_config), ranks.world_size)
    check_devices(config, ranks)
    rendezvous = rendezvous_for(config)
    name = (
        f"rank {ranks.rank} (node {ranks.node_rank})"
        if ranks.launched
        else f"node {ranks.node_rank}"
    )
    logger.info(
        "%s: serving %s headless for the engine at %s (waiting up to %g s for it)",
        name,
        ranks.describe(),
        rendezvous.endpoint,
        rendezvous.timeout_s,
    )
    workers = spawn_workers(ranks, rendezvous)
    if workers.processes:
        workers.watch(lambda why: _stop_node(name, why))
    try:
        run_rank(
            ranks.rank,
            ranks.local_rank,
            ranks.world_size,
            rendezvous,
            workers.check_alive,
            layout_of(config),
        )
    except WorkerDiedError as exc:
        logger.error("%s: %s; exiting", name, exc)
        return 1
    finally:
        workers.stop()  # they had the same shutdown step, or lost the same connection
    logger.info("%s: rank 0 sent the shutdown step; exiting", name)
    return 0


def _stop_node(name: str, why: str) -> None:
    """One of this node's workers died: the group cannot run a step any more, so the node
    ends at once (its other workers exit with it; rank 0's next collective fails)."""
    logger.error("%s: %s; exiting", name, why)
    logging.shutdown()
    os._exit(1)
