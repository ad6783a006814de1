"""Tensor-parallel workers: every rank but 0, each a process running the model's forward
pass on its share of the weights and KV pool, step by step as rank 0 sends them.

``start_workers`` (in the engine, rank 0) starts the workers of node 0 as
``python -m infer.engine.setup.tp_worker`` processes and joins the group with them; the ranks of
other nodes come from ``tp_node.serve_node`` there (``infer serve --node-rank N``), or from a
launcher (torchrun) that starts every rank itself (``distributed/layout.py``).

A worker exits when rank 0 sends the shutdown step (``None``); when its connection to the
group breaks (rank 0, or a rank between, went away); and, for the workers a node started,
when that node's process goes away (its end of the worker's stdin closes). Rank 0 learns
that one of its own workers died from ``Workers.watch`` (the server's engine) or before its
next step; a rank of another node, when its next collective fails.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from infer.config import EngineConfig, ModelConfig
from infer.distributed.group import (
    ParallelGroup,
    WorkerDiedError,
    close_group,
    join_group,
    open_compute,
)
from infer.distributed.layout import (
    NodeRanks,
    Rendezvous,
    layout_of,
    node_ranks,
    rendezvous_for,
)
from infer.engine.core.runner import ModelRunner, StepInputs
from infer.engine.setup.rank import build_rank
from infer.loader import resolve_model

logger = logging.getLogger(__name__)
_PARENT_PIPE = "INFER_TP_PARENT_PIPE"  # set for workers whose stdin is rank 0's pipe
STOP_TIMEOUT_S = 30.0


class Workers:
    """The worker processes this machine started (none for an externally launched group)."""

    def __init__(self, processes: dict[int, subprocess.Popen[bytes]]) -> None:
        self.processes = processes
        self.group: ParallelGroup | None = None
        self.threads_before: int | None = None  # rank 0's CPU threads, restored at ``stop``
        self._stopping = False
        self._watcher: threading.Thread | None = None
        atexit.register(self.stop)

    def check_alive(self, grace_s: float = 0.0) -> None:
        """``WorkerDiedError`` naming the first worker that has exited (waiting up to
        ``grace_s`` for one that is going down)."""
        deadline = time.monotonic() + grace_s
        while True:
            for rank, process in self.processes.items():
                if process.poll() is not None:
                    raise WorkerDiedError(
                        f"tensor-parallel worker rank {rank} exited with code "
                        f"{process.returncode} (its log is above)"
                    )
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call ``on_death`` with why, from a thread of its own, as soon as a worker exits
        before ``stop``: rank 0 may be waiting in a collective that the dead worker never
        joins (gloo fails only the step; NCCL waits for its timeout), or idle."""
        pidfds = [os.pidfd_open(process.pid) for process in self.processes.values()]
        self._watcher = threading.Thread(
            target=self._watch, args=(pidfds, on_death), name="infer-tp-watch", daemon=True
        )
        self._watcher.start()

    def _watch(self, pidfds: list[int], on_death: Callable[[str], None]) -> None:
        poller = select.poll()
        for fd in pidfds:
            poller.register(fd, select.POLLIN)  # readable once its process has exited
        poller.poll()
        for fd in pidfds:
            os.close(fd)
        if self._stopping:
            return
        try:
            self.check_alive()
        except WorkerDiedError as exc:
            on_death(str(exc))

    def stop(self) -> None:
        """Send the shutdown step, wait for the workers, kill those that do not exit."""
        self._stopping = True  # their exits are no news to the watcher
        group, self.group = self.group, None
        if group is not None:
            try:
                group.broadcast_object(None)
            except Exception:  # a dead worker: the others are stopped below
                logger.warning("could not send the shutdown step to every worker")
            close_group()
        for process in self.processes.values():
            if process.stdin is not None:
                process.stdin.close()  # the workers' parent watch exits them
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._watcher is not None:
            self._watcher.join()  # woken by the workers' exits
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)
            self.threads_before = None
        self.processes = {}
        atexit.unregister(self.stop)


def start_workers(config: EngineConfig) -> tuple[Workers, ParallelGroup]:
    """Start node 0's workers, join the group as rank 0, and send every rank the config."""
    ranks = node_ranks(config)
    if not ranks.runs_engine:
        raise ValueError(
            f"node_rank: the engine runs on node 0 only (rank 0); this process would be "
            f"{ranks.describe()}: run them with `infer serve ... --node-rank "
            f"{ranks.node_rank}` (infer.engine.setup.tp_node.serve_node)"
        )
    check_devices(config, ranks)
    rendezvous = rendezvous_for(config)
    workers = spawn_workers(ranks, rendezvous)
    if config.resolved_device.type == "cpu":
        workers.threads_before = torch.get_num_threads()
        share_cpu(rendezvous.ranks_per_node)
    if config.nnodes > 1 or ranks.launched:
        logger.info(
            "rank 0: waiting up to %g s at %s for ranks 1-%d to join",
            rendezvous.timeout_s,
            rendezvous.endpoint,
            ranks.world_size - 1,
        )
    try:
        group = join_group(0, ranks.world_size, rendezvous, workers.check_alive, layout_of(config))
        workers.group = group
        group.broadcast_object(config)
        open_compute(group, config.resolved_device)
    except Exception:
        workers.stop()
        raise
    return workers, group


def spawn_workers(ranks: NodeRanks, rendezvous: Rendezvous) -> Workers:
    """Start the worker processes of ``ranks.spawned``, each told where to meet rank 0."""
    env = {**os.environ, **rendezvous.env(), "WORLD_SIZE": str(ranks.world_size), _PARENT_PIPE: "1"}
    command = [sys.executable, "-m", "infer.engine.setup.tp_worker"]
    processes = {
        rank: subprocess.Popen(
            command,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(ranks.local_rank_of(rank))},
            stdin=subprocess.PIPE,
        )
        for rank in ranks.spawned
    }
    return Workers(processes)


def share_cpu(ranks_on_node: int) -> None:
    """Give this CPU rank its share of the node's cores: ranks that each run a thread per
    core spin against one another and wait on the slowest in every collective. Unless
    ``OMP_NUM_THREADS`` chose already (torchrun sets it)."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // ranks_on_node))


def check_devices(config: EngineConfig, ranks: NodeRanks) -> None:
    """``ValueError`` naming the flag when this node has fewer GPUs than its ranks need."""
    if config.resolved_device.type != "cuda":
        return
    needed = ranks.local_rank + len(ranks.spawned) + 1
    visible = torch.cuda.device_count()
    if needed > visible:
        raise ValueError(
            f"tensor_parallel_size: this node runs {ranks.describe()} on cuda:0 to "
            f"cuda:{needed - 1} (tensor_parallel_size / nnodes GPUs), but {visible} "
            f"{'is' if visible == 1 else 'are'} visible"
        )


def _exit_with_parent() -> None:
    """Exit as soon as rank 0's process closes our stdin (it stopped, or died). The watch
    reads the file descriptor, not ``sys.stdin``: a daemon thread blocked in a buffered read
    holds its lock, and the interpreter's exit, closing stdin, aborts on it."""

    def watch() -> None:
        while os.read(sys.stdin.fileno(), 4096):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="infer-parent-watch", daemon=True).start()


def _from_rank_0(group: ParallelGroup) -> Any:
    """Rank 0's next broadcast; ``WorkerDiedError`` once the group's connection broke."""
    try:
        return group.broadcast_object(None)
    except WorkerDiedError:
        raise
    except RuntimeError as exc:  # gloo: a peer's connection closed
        raise WorkerDiedError(
            f"the connection to the group broke (rank 0, or a rank between, went away): {exc}"
        ) from exc


@torch.inference_mode()
def follow_steps(runner: ModelRunner, group: ParallelGroup, device: torch.device) -> None:
    """Run every step rank 0 sends until it sends ``None``."""
    step: StepInputs | None
    while (step := _from_rank_0(group)) is not None:
        input_ids = None
        if step.ahead:
            buffer = torch.empty(step.num_tokens, dtype=torch.int64, device=device)
            input_ids = group.broadcast_tensor(buffer)
        runner.run_model(step, input_ids)


def run_rank(
    rank: int,
    local_rank: int,
    world_size: int,
    rendezvous: Rendezvous,
    check_alive: Callable[[], None] | None = None,
    layout: dict[str, str] | None = None,
) -> None:
    """Be ``rank`` until rank 0 sends the shutdown step: join, take rank 0's config, build
    this rank's share of the model, follow the steps. ``WorkerDiedError`` when the group's
    connection breaks."""
    group = join_group(rank, world_size, rendezvous, check_alive, layout)
    config: EngineConfig = _from_rank_0(group)
    device = config.resolved_device
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        share_cpu(rendezvous.ranks_per_node)
    open_compute(group, device)
    source = resolve_model(config.model)
    model_config = ModelConfig.from_hf_dict(source.hf_config)
    max_seq_len = config.resolved_max_seq_len(model_config)
    state = build_rank(config, source, model_config, max_seq_len, device, group)
    follow_steps(state.runner, group, device)
    state.runner.release_graphs()
    close_group()


def main() -> None:
    """A worker's entry point (``python -m infer.engine.setup.tp_worker``), from the environment
    its node (or a launcher) set."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if os.environ.get(_PARENT_PIPE):
        _exit_with_parent()
    rank = int(os.environ["RANK"])
    try:
        run_rank(
            rank,
            int(os.environ.get("LOCAL_RANK", rank)),
            int(os.environ["WORLD_SIZE"]),
            Rendezvous.from_env(),
        )
    except WorkerDiedError as exc:
        logger.error("rank %d: %s; exiting", rank, exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
