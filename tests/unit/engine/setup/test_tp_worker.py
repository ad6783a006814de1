"""A tensor-parallel worker's process: it ends with rank 0's, and ends cleanly on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from infer.config import EngineConfig
from infer.distributed.layout import node_ranks
from infer.engine.setup.tp_worker import check_devices, share_cpu

WATCHED = "from infer.engine.setup.tp_worker import _exit_with_parent\n_exit_with_parent()\n"


def _worker(body: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", WATCHED + body], stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )


def test_a_worker_that_returns_exits_cleanly_while_rank_0_still_holds_its_stdin() -> None:
    worker = _worker("import time; time.sleep(0.5)\n")  # then the interpreter exits
    assert worker.stderr is not None and worker.stdin is not None
    stderr = worker.stderr.read()  # to its end: the worker's, with its stdin still open
    assert worker.wait(timeout=120) == 0, stderr.decode()
    assert b"Fatal Python error" not in stderr
    worker.stdin.close()


def test_a_worker_exits_when_rank_0_closes_its_stdin() -> None:
    worker = _worker("print('ready', flush=True, file=__import__('sys').stderr)\n"
                     "import time; time.sleep(600)\n")  # fmt: skip
    assert worker.stderr is not None and worker.stdin is not None
    assert worker.stderr.readline() == b"ready\n"
    closed = time.monotonic()
    worker.stdin.close()
    assert worker.wait(timeout=30) == 0
    assert time.monotonic() - closed < 30


def test_more_ranks_on_a_node_than_visible_gpus_names_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = EngineConfig(device="cpu", tensor_parallel_size=8, nnodes=2, node_rank=1)
    config.device = "cuda"  # as on a GPU node (validated on this CPU-only machine as "cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"^tensor_parallel_size: .*ranks 4-7 of 8 .*2 are"):
        check_devices(config, node_ranks(config))
    fits = EngineConfig(device="cpu", tensor_parallel_size=8, nnodes=4, node_rank=1)
    fits.device = "cuda"
    check_devices(fits, node_ranks(fits))  # two ranks a node: cuda:0 and cuda:1


def test_cpu_ranks_share_the_nodes_cores_unless_omp_num_threads_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        share_cpu(ranks_on_node=3)
        assert torch.get_num_threads() == 2
        share_cpu(ranks_on_node=16)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(before)
        monkeypatch.setenv("OMP_NUM_THREADS", "4")
        share_cpu(ranks_on_node=3)
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
