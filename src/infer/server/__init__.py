"""OpenAI-compatible HTTP server: ``infer serve`` (``python -m infer.cli serve``)."""

from __future__ import annotations

from typing import Any

__all__ = ["build_server", "create_app", "serve_in_thread", "spawn_server"]


def __getattr__(name: str) -> Any:
    # The app pulls in FastAPI and the engine's client; ``infer --help`` only needs the
    # defaults of ``server.request_limits``, so nothing is imported until it is asked for.
    if name == "create_app":
        from infer.server.api import create_app

        return create_app
    if name in ("build_server", "serve_in_thread", "spawn_server"):
        from infer.server import launch

        return getattr(launch, name)
    raise AttributeError(name)
