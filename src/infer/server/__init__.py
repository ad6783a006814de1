"""OpenAI-compatible HTTP server: ``infer serve`` (``python -m infer.cli serve``).

A request passes ``guards/`` (hosts, keys, sizes, counts), an endpoint of ``http/`` (which
speaks ``openai/``'s protocol), and reaches the engine process through ``bridge/``; the API
process imports nothing of the engine (what the two share is ``infer.contract``)."""

from __future__ import annotations

from typing import Any

__all__ = ["build_server", "create_app", "serve_in_thread", "spawn_server"]


def __getattr__(name: str) -> Any:
    # The app pulls in FastAPI and the engine's client; ``infer --help`` only needs the
    # defaults of ``guards.request_limits``, so nothing is imported until it is asked for.
    if name == "create_app":
        from infer.server.http.api import create_app

        return create_app
    if name in ("build_server", "serve_in_thread", "spawn_server"):
        from infer.server.bridge import launch

        return getattr(launch, name)
    raise AttributeError(name)
