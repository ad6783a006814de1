"""Stand-in workers (``standin_worker.py``, each a process a test can kill) and the router
in front of them (a real uvicorn in a thread)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from infer.router.app import create_router_app
from infer.server.bridge.launch import serve_in_thread

HEALTH_INTERVAL_S = 0.2
_WORKER = Path(__file__).with_name("standin_worker.py")


@contextmanager
def standin_workers(*names: str) -> Iterator[dict[str, tuple[str, subprocess.Popen[str]]]]:
    """``{name: (url, process)}`` of stand-in workers, started together."""
    processes = {
        name: subprocess.Popen(
            [sys.executable, str(_WORKER), name], stdout=subprocess.PIPE, text=True
        )
        for name in names
    }
    try:
        workers = {}
        for name, process in processes.items():
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("READY "), f"stand-in worker {name} did not start"
            workers[name] = (line.split()[1], process)
        yield workers
    finally:
        for process in processes.values():
            process.kill()
            process.wait(10)


@contextmanager
def running_router(workers: list[str], **options: Any) -> Iterator[str]:
    """The URL of a router in front of ``workers``, serving until the context ends."""
    app = create_router_app(workers, health_interval=HEALTH_INTERVAL_S, **options)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    with serve_in_thread(uvicorn.Server(config), startup_timeout=30) as url:
        yield url


@pytest.fixture(scope="module")
def three_workers() -> Iterator[dict[str, str]]:
    with standin_workers("a", "b", "c") as workers:
        yield {name: url for name, (url, _) in workers.items()}
