"""``--api-key`` guards every route but the probes, and is decided from the headers: a
request without the key gets its 401 before any of its body is read, and a connection
still sending one is closed."""

from __future__ import annotations

import socket

import httpx
from starlette.types import Receive, Scope, Send
from tests.unit.server.guards.conftest import Serve, closed_by_server

from infer.server.guards.auth import APIKeyMiddleware

KEY = "sk-secret"


class ReadingApp:
    """Reads the whole body, then answers how much it read."""

    def __init__(self) -> None:
        self.bodies_read = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        size = 0
        while (message := await receive())["type"] == "http.request":
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        self.bodies_read += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % size})


def test_every_route_but_the_probes_needs_the_key(serve: Serve) -> None:
    app = ReadingApp()
    with serve(APIKeyMiddleware(app, KEY)) as (host, port):
        base = f"http://{host}:{port}"
        for path in ("/tokenize", "/detokenize", "/v1/models", "/v1/cache/stats",
                     "/dashboard", "/docs", "/openapi.json", "/anything"):  # fmt: skip
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                refused = httpx.get(base + path, headers=headers)
                assert refused.status_code == 401, path
                assert refused.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(base + path, headers={"Authorization": f"Bearer {KEY}"}).text == "0"
        for path in ("/health", "/ping", "/version", "/metrics"):
            assert httpx.get(base + path).status_code == 200
        assert app.bodies_read == 8 + 4


def test_only_pages_a_browser_opens_take_the_key_in_the_query(serve: Serve) -> None:
    with serve(APIKeyMiddleware(ReadingApp(), KEY)) as (host, port):
        base = f"http://{host}:{port}"
        for path in ("/dashboard", "/dashboard/stream", "/docs", "/redoc", "/openapi.json"):
            assert httpx.get(f"{base}{path}?api_key={KEY}").status_code == 200
            assert httpx.get(f"{base}{path}?api_key=wrong").status_code == 401
        assert httpx.get(f"{base}/v1/models?api_key={KEY}").status_code == 401
        assert httpx.post(f"{base}/dashboard?api_key={KEY}").status_code == 401


def test_a_keyless_upload_is_refused_before_its_body_and_its_connection_closed(
    serve: Serve,
) -> None:
    app = ReadingApp()
    with serve(APIKeyMiddleware(app, KEY)) as address:
        for framing in (b"Content-Length: 2000000000", b"Transfer-Encoding: chunked"):
            with socket.create_connection(address) as conn:
                conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + framing
                             + b"\r\n\r\n")  # fmt: skip
                conn.settimeout(5)
                answer = conn.recv(4096)  # at once: no byte of the body was sent
                assert answer.startswith(b"HTTP/1.1 401"), answer
                assert b"connection: close" in answer.lower()
                assert closed_by_server(conn, within=5)
        with socket.create_connection(address) as conn:  # no body: the connection stays
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")
            conn.settimeout(5)
            assert conn.recv(4096).startswith(b"HTTP/1.1 401")
            assert not closed_by_server(conn, within=0.3)
    assert app.bodies_read == 0
