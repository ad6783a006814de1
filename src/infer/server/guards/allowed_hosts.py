"""``--allowed-hosts``: the names a request's ``Host`` header may give, so that a web page
cannot reach the server through DNS rebinding (a name of the attacker's that resolves to
the server's address: the browser then sends that name as the ``Host``).

A server bound to a loopback address answers loopback names only unless told otherwise
(as Ollama does): it is meant for this machine, and a browser on it is the one way a
stranger's page reaches it. A server bound further answers any name unless given a list.
A request refused here gets a 400 before its body is read. The probes (``/health`` and
the others open without the key) answer any name: a prober addresses the server as it can.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import lru_cache

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from infer.server.guards.auth import OPEN_PATHS
from infer.server.http.errors import APIError, refuse_before_body

# Loopback names: ``localhost`` and its subdomains (RFC 6761), and loopback addresses.
LOOPBACK_NAMES = ("localhost", "*.localhost", "127.0.0.1", "::1")
ANY_HOST = "*"
# ``Host`` headers remembered with their answer: clients send the same few, and matching one
# anew (an address parsed against each pattern) cost ~7 us a request; a bound, since the
# header is the client's to choose.
CACHED_HOSTS = 1024


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a ``Host`` name, without its port) is this
    machine's loopback: ``localhost`` (and its subdomains) or a loopback address."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind_host: str) -> tuple[str, ...]:
    """What ``--allowed-hosts`` defaults to for a server bound to ``bind_host``."""
    return LOOPBACK_NAMES if is_loopback(bind_host) else (ANY_HOST,)


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8000`` → ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header[1:]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(name: str, allowed: Sequence[str]) -> bool:
    """Whether ``name`` matches one of ``allowed``: a name, ``*.suffix`` (any subdomain,
    not the suffix itself), or ``*`` (anything). A loopback address matches any loopback
    address: the whole 127.0.0.0/8 reaches the same server."""
    name = name.rstrip(".")
    for pattern in allowed:
        pattern = pattern.lower().strip("[]").rstrip(".")
        if pattern in (ANY_HOST, name):
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
        if _loopback_address(pattern) and _loopback_address(name):
            return True
    return False


def _loopback_address(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class AllowedHosts:
    """ASGI middleware: a request whose ``Host`` is not allowed gets a 400. A request
    without one (HTTP/1.0) passes: every browser sends one."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = tuple(allowed)
        assert ANY_HOST not in self.allowed, "install no check instead"
        self.allows = lru_cache(maxsize=CACHED_HOSTS)(self._allows)

    def _allows(self, header: str) -> bool:
        """Whether a request with this ``Host`` header is answered."""
        return host_allowed(host_name(header), self.allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            header = Headers(scope=scope).get("host")
            if header is not None and not self.allows(header):
                error = APIError(
                    400,
                    f"Host: {header!r} is not a name this server answers to (--allowed-hosts)",
                    param="Host",
                    code="host_not_allowed",
                )
                await refuse_before_body(error, scope, receive, send)
                return
        await self.app(scope, receive, send)
