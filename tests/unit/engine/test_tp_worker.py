"""A tensor-parallel worker's process: it ends with rank 0's, and ends cleanly on its own."""

from __future__ import annotations

import subprocess
import sys
import time

WATCHED = "from infer.engine.tp_worker import _exit_with_parent\n_exit_with_parent()\n"


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
