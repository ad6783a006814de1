"""OpenAI-compatible HTTP server: ``infer serve`` (``python -m infer.cli serve``)."""

from infer.server.api import create_app
from infer.server.launch import build_server, serve_in_thread, spawn_server

__all__ = ["build_server", "create_app", "serve_in_thread", "spawn_server"]
