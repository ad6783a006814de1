"""Launching: the port is bound before the model loads, and the connection defaults."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer import EngineConfig
from infer.server import build_server


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_busy_port_fails_at_once(taken_port: int) -> None:
    with pytest.raises(ValueError, match=r"^port: cannot bind 127\.0\.0\.1:"):
        build_server(EngineConfig(model="smollm2-135m", device="cpu"), port=taken_port)


def test_infer_serve_on_a_busy_port_exits_before_loading_the_model(taken_port: int) -> None:
    command = [sys.executable, "-m", "infer.server", "--model", "smollm2-135m",
               "--device", "cpu", "--port", str(taken_port)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"error: port: cannot bind 127.0.0.1:{taken_port}" in done.stderr
    assert "loading" not in done.stderr.lower() and "Uvicorn running" not in done.stderr


def test_connection_defaults() -> None:
    config = EngineConfig(
        model="smollm2-135m", device="cpu", max_batch_size=8, max_waiting_requests=24
    )
    server = build_server(config, port=0)
    server.listener.close()
    assert server.config.timeout_keep_alive >= 30  # beyond clients' own expiry (httpx: 5 s)
    assert server.config.connection_limit == 8 + 24 + 256
    assert server.config.limit_concurrency is None  # uvicorn's plain-text 503 never fires
    with pytest.raises(ValueError, match=r"^limit_concurrency:"):
        build_server(config, port=0, limit_concurrency=0)
    with pytest.raises(ValueError, match=r"^request_read_timeout:"):
        build_server(config, port=0, request_read_timeout=0)


def test_api_server_count_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    config = EngineConfig(model="smollm2-135m", device="cpu")
    with pytest.raises(ValueError, match=r"^api_server_count: must be >= 1"):
        build_server(config, port=0, api_server_count=0)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ValueError, match=r"^api_server_count: 2 API processes need "):
        build_server(config, port=0, api_server_count=2)


def test_several_api_processes_share_the_port_and_the_connection_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    config = EngineConfig(
        model="smollm2-135m", device="cpu", max_batch_size=8, max_waiting_requests=24
    )
    server = build_server(config, port=0, api_server_count=3)
    try:
        assert server.listener.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        assert server.config.connection_limit == -(-(8 + 24 + 256) // 3)
        assert server.workers is not None
    finally:
        server.listener.close()
