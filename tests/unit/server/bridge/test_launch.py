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
from infer.server.bridge.launch import drain_time, warn_if_open
from infer.server.guards.concurrency import ConcurrencyLimit
from infer.server.guards.connections import ConnectionLimits
from infer.server.guards.request_head import HeadLimits


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
    command = [sys.executable, "-m", "infer.cli", "serve", "--model", "smollm2-135m",
               "--device", "cpu", "--port", str(taken_port)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"error: port: cannot bind 127.0.0.1:{taken_port}" in done.stderr
    assert "loading" not in done.stderr.lower() and "Uvicorn running" not in done.stderr


@pytest.mark.parametrize("api_server_count", [1, 2])
def test_a_second_server_cannot_join_a_port_shared_by_another(api_server_count: int) -> None:
    """A process listening with ``SO_REUSEPORT`` (as API processes once did) invites others
    of its user to share the port; a server never accepts, whatever its process count."""
    with socket.socket() as first:
        first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        first.bind(("127.0.0.1", 0))
        first.listen()
        port = first.getsockname()[1]
        command = [sys.executable, "-m", "infer.cli", "serve", "--model", "smollm2-135m",
                   "--device", "cpu", "--port", str(port),
                   "--api-server-count", str(api_server_count)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"port: cannot bind 127.0.0.1:{port}: Address already in use" in done.stderr


def test_connection_defaults() -> None:
    config = EngineConfig(
        model="smollm2-135m", device="cpu", max_batch_size=8, max_waiting_requests=24
    )
    server = build_server(config, port=0)
    server.listener.close()
    assert server.config.timeout_keep_alive >= 30  # beyond clients' own expiry (httpx: 5 s)
    assert server.config.limits == ConnectionLimits(
        header_timeout=5.0,
        request_read_timeout=30.0,
        pending=1024,
        pending_per_client=256,
        head=HeadLimits(max_header_bytes=32 * 1024, max_headers=100),
    )
    # Outermost first: a request's Host and key, then its body's size, are checked before
    # anything reads or buffers its body.
    order = [m.cls.__name__ for m in server.config.app.user_middleware]
    assert order == ["LimitsApplied", "AllowedHosts", "BodyLimit", "ConcurrencyLimit"]
    (concurrency,) = [m for m in server.config.app.user_middleware if m.cls is ConcurrencyLimit]
    assert concurrency.kwargs["limit"] == 8 + 24 + 256  # requests
    assert concurrency.kwargs["exempt"] == {"/health", "/ping", "/metrics"}
    assert server.config.limit_concurrency is None  # uvicorn's count of connections: unused
    for bad, message in (
        (dict(limit_concurrency=0), r"^limit_concurrency: must be >= 1"),
        (dict(header_timeout=0), r"^header_timeout: must be > 0"),
        (dict(header_timeout=10, request_read_timeout=5), r"^request_read_timeout: must be >="),
        (dict(limit_pending_connections=0), r"^limit_pending_connections: must be >= 1"),
        (dict(limit_pending_per_client=0), r"^limit_pending_per_client: must be >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            build_server(config, port=0, **bad)  # type: ignore[arg-type]


def test_api_server_count_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    config = EngineConfig(model="smollm2-135m", device="cpu")
    with pytest.raises(ValueError, match=r"^api_server_count: must be >= 1"):
        build_server(config, port=0, api_server_count=0)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ValueError, match=r"^api_server_count: 2 API processes need "):
        build_server(config, port=0, api_server_count=2)


def test_several_api_processes_share_the_port_and_the_bounds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    config = EngineConfig(
        model="smollm2-135m", device="cpu", max_batch_size=8, max_waiting_requests=24
    )
    server = build_server(config, port=0, api_server_count=3)
    try:
        assert server.workers is not None
        # one socket, handed to the workers: no other process can join the port
        assert not server.listener.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        assert all(spec.listener is server.listener for spec in server.workers._specs)
        (concurrency,) = [m for m in server.config.app.user_middleware if m.cls is ConcurrencyLimit]
        assert concurrency.kwargs["limit"] == 8 + 24 + 256  # counted by all three together
        assert server.config.limits.pending == -(-1024 // 3)  # each process's share
        assert server.config.limits.pending_per_client == -(-256 // 3)
    finally:
        server.listener.close()


def test_requests_get_the_shutdown_timeout_but_what_stopping_takes() -> None:
    assert drain_time(10.0) == 9.0
    assert drain_time(1.0) == 0.5  # half, at most
    assert drain_time(0.0) == 0.0


def test_listening_beyond_loopback_without_a_key_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for host, key, warned in (("0.0.0.0", None, True), ("::", "", True), ("10.1.2.3", None, True),
                              ("0.0.0.0", "sk-key", False), ("127.0.0.1", None, False),
                              ("localhost", None, False), ("::1", None, False)):  # fmt: skip
        caplog.clear()
        with caplog.at_level("WARNING", logger="infer.server.bridge.launch"):
            warn_if_open(host, key)
        assert ("without --api-key" in caplog.text) == warned, host
