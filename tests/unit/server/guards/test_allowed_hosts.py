"""``--allowed-hosts``: a ``Host`` not allowed is a 400 (DNS rebinding cannot reach the
server under a stranger's name); a loopback-bound server answers loopback names only
unless told otherwise; the probes answer any name."""

from __future__ import annotations

import httpx
import pytest
from tests.unit.server.guards.conftest import Serve
from tests.unit.server.guards.test_auth import ReadingApp

from infer.server.guards.allowed_hosts import (
    CACHED_HOSTS,
    AllowedHosts,
    default_allowed_hosts,
    host_allowed,
    host_name,
    is_loopback,
)


@pytest.mark.parametrize(
    ("header", "name"),
    [("example.com:8000", "example.com"), ("[::1]:8000", "::1"), ("::1", "::1"),
     ("LOCALHOST", "localhost"), ("127.0.0.1", "127.0.0.1")],
)  # fmt: skip
def test_the_name_of_a_host_header(header: str, name: str) -> None:
    assert host_name(header) == name


def test_patterns() -> None:
    loopback = default_allowed_hosts("127.0.0.1")
    for name in ("localhost", "app.localhost", "127.0.0.1", "127.0.0.2", "::1"):
        assert host_allowed(name, loopback), name
    for name in ("evil.example", "localhost.evil.example", "10.0.0.1", "0.0.0.0"):
        assert not host_allowed(name, loopback), name
    assert host_allowed("a.example.com", ["*.example.com"])
    assert not host_allowed("example.com", ["*.example.com"])
    assert not host_allowed("badexample.com", ["*.example.com"])
    assert host_allowed("example.com.", ["example.com"])  # the root's dot
    assert default_allowed_hosts("0.0.0.0") == ("*",) and default_allowed_hosts("::") == ("*",)
    assert default_allowed_hosts("localhost") == loopback
    assert is_loopback("::1") and not is_loopback("192.168.0.1")


def test_a_host_not_allowed_is_a_400_before_the_body(serve: Serve) -> None:
    app = ReadingApp()
    with serve(AllowedHosts(app, ["api.example.com"])) as (host, port):
        url = f"http://{host}:{port}"
        refused = httpx.post(f"{url}/v1/completions", content=b"{}")  # Host: 127.0.0.1:port
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "host_not_allowed"
        assert "(--allowed-hosts)" in refused.json()["error"]["message"]
        assert refused.headers["connection"] == "close"
        named = {"Host": "api.example.com:443"}
        assert httpx.post(f"{url}/v1/completions", content=b"{}", headers=named).text == "2"
        assert httpx.get(f"{url}/health").status_code == 200
    assert app.bodies_read == 2


def test_a_host_header_is_answered_as_matching_it_anew_would() -> None:
    """Answers are remembered per header (a bounded number of them); each is the one
    ``host_allowed`` gives, on every request."""
    guard = AllowedHosts(ReadingApp(), default_allowed_hosts("127.0.0.1"))
    headers = ["127.0.0.1:8000", "localhost", "[::1]:80", "app.localhost:1", "127.0.0.2",
               "evil.example", "10.0.0.1:8000", "localhost.evil.example"]  # fmt: skip
    for _ in range(2):
        for header in headers:
            assert guard.allows(header) == host_allowed(host_name(header), guard.allowed)
    assert guard.allows.cache_info().hits == len(headers)
    assert guard.allows.cache_info().maxsize == CACHED_HOSTS
