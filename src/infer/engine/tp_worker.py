"""Tensor-parallel workers: ranks 1..N-1, each a process running the model's forward pass
on its share of the weights and KV pool, step by step as rank 0 sends them.

``start_workers`` (in the engine, rank 0) starts the workers of this machine as
``python -m infer.engine.tp_worker`` processes and joins the group with them. When the
environment already names a multi-node group (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), it starts none: every other rank is launched the same way on its node.

A worker exits when rank 0 sends the shutdown step (``None``), and, for the workers started
here, when rank 0's process goes away (its end of the worker's stdin closes). Rank 0 learns
that one of them died from ``Workers.watch`` (the server's engine) or before its next step.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch

from infer.config import EngineConfig, ModelConfig
from infer.distributed.group import (
    ParallelGroup,
    WorkerDiedError,
    close_group,
    join_group,
    open_compute,
)
from infer.engine.rank import build_rank
from infer.engine.runner import ModelRunner, StepInputs
from infer.loader import resolve_model

logger = logging.getLogger(__name__)
_PARENT_PIPE = "INFER_TP_PARENT_PIPE"  # set for workers whose stdin is rank 0's pipe
STOP_TIMEOUT_S = 30.0


class Workers:
    """The worker processes this machine started (none for an externally launched group)."""

    def __init__(self, processes: dict[int, subprocess.Popen[bytes]]) -> None:
        self.processes = processes
        self.group: ParallelGroup | None = None
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
        self.processes = {}
        atexit.unregister(self.stop)


def start_workers(config: EngineConfig) -> tuple[Workers, ParallelGroup]:
    """Start this machine's workers, join the group as rank 0, and send them the config."""
    world = config.tensor_parallel_size
    if "WORLD_SIZE" in os.environ:  # a multi-node group: the user starts every other rank
        if int(os.environ["WORLD_SIZE"]) != world or int(os.environ.get("RANK", "0")) != 0:
            raise ValueError(
                "tensor_parallel_size: the engine is rank 0 of WORLD_SIZE ranks; got "
                f"RANK={os.environ.get('RANK')} WORLD_SIZE={os.environ['WORLD_SIZE']} "
                f"for {world} ranks"
            )
        workers = Workers({})
    else:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(_free_port())
        workers = Workers({rank: _spawn(rank, world) for rank in range(1, world)})
    try:
        group = join_group(0, world, workers.check_alive)
        workers.group = group
        group.broadcast_object(config)
        open_compute(group, config.resolved_device)
    except Exception:
        workers.stop()
        raise
    return workers, group


def _spawn(rank: int, world: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        _PARENT_PIPE: "1",
    }
    command = [sys.executable, "-m", "infer.engine.tp_worker"]
    return subprocess.Popen(command, env=env, stdin=subprocess.PIPE)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _exit_with_parent() -> None:
    """Exit as soon as rank 0's process closes our stdin (it stopped, or died). The watch
    reads the file descriptor, not ``sys.stdin``: a daemon thread blocked in a buffered read
    holds its lock, and the interpreter's exit, closing stdin, aborts on it."""

    def watch() -> None:
        while os.read(sys.stdin.fileno(), 4096):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="infer-parent-watch", daemon=True).start()


@torch.inference_mode()
def follow_steps(runner: ModelRunner, group: ParallelGroup, device: torch.device) -> None:
    """Run every step rank 0 sends until it sends ``None``."""
    step: StepInputs | None
    while (step := group.broadcast_object(None)) is not None:
        input_ids = None
        if step.ahead:
            buffer = torch.empty(step.num_tokens, dtype=torch.int64, device=device)
            input_ids = group.broadcast_tensor(buffer)
        runner.run_model(step, input_ids)


def main() -> None:
    """A worker's entry point (``python -m infer.engine.tp_worker``)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if os.environ.get(_PARENT_PIPE):
        _exit_with_parent()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    group = join_group(rank, world)
    config: EngineConfig = group.broadcast_object(None)
    device = config.resolved_device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    open_compute(group, device)
    source = resolve_model(config.model)
    model_config = ModelConfig.from_hf_dict(source.hf_config)
    max_seq_len = config.resolved_max_seq_len(model_config)
    state = build_rank(config, source, model_config, max_seq_len, device, group)
    follow_steps(state.runner, group, device)
    state.runner.release_graphs()
    close_group()


if __name__ == "__main__":
    main()
