"""A server over the stand-in engine (``infer.engine.standin``) in a child process of its
own, so that clients measured from this process do not share its GIL and event loop."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from infer.config import EngineConfig
from infer.engine.standin import standin_engine
from infer.server.bridge.launch import build_server

_START_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 60.0


def _serve(config: EngineConfig, step_s: float, urls: Any) -> None:
    server = build_server(
        config, port=0, log_level="warning", engine_factory=partial(standin_engine, step_s=step_s)
    )
    host, port = server.listener.getsockname()[:2]
    server.on_started = lambda: urls.put(f"http://{host}:{port}")
    server.run()


@contextmanager
def standin_server(config: EngineConfig, step_s: float) -> Iterator[str]:
    """The URL of a stand-in server for ``config`` (each step ``step_s`` seconds), serving
    until the context ends (then SIGTERM: a graceful shutdown)."""
    context = multiprocessing.get_context("spawn")
    urls = context.Queue()
    # not a daemon: the server starts an engine process of its own
    process = context.Process(target=_serve, args=(config, step_s, urls))
    process.start()
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            with contextlib.suppress(queue.Empty):
                url: str = urls.get(timeout=0.5)
                break
            if not process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the stand-in server did not start")
        yield url
    finally:
        process.terminate()
        process.join(_STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
