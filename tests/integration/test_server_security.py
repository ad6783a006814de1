"""Issue 53 through a real server with a key: every route but the probes needs it, and it,
the ``Host`` and the body's size are decided from the headers before any of the body is
read; heads are bounded; tenants' prefix-cache entries stay apart (``cache_salt``); strict
schemas, tool messages and the offline API reference."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest
from tests.integration.conftest import chromium

from infer.server import build_server, serve_in_thread
from infer.server.guards.request_head import HeadLimits
from infer.server.guards.request_limits import RequestLimits

KEY = "sk-security-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 256 * 1024
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4  # 41 tokens: two full blocks


@pytest.fixture(scope="module")
def url(smollm2_config: Any) -> Any:
    server = build_server(
        smollm2_config, port=0, log_level="warning", api_key=KEY,
        limits=RequestLimits(max_body_bytes=LIMIT), head=HeadLimits(8192, 32),
    )  # fmt: skip
    with serve_in_thread(server) as base_url:
        yield base_url


def _address(url: str) -> tuple[str, int]:
    parsed = httpx.URL(url)
    assert parsed.host and parsed.port
    return parsed.host, parsed.port


def _answer_to_head(url: str, head: bytes) -> bytes:
    """What the server answers a request of which only ``head`` was sent."""
    with socket.create_connection(_address(url)) as conn:
        conn.sendall(head)
        conn.settimeout(10)
        return conn.recv(4096)


def test_every_route_but_the_probes_needs_the_key(url: str) -> None:
    guarded = [("GET", "/v1/models"), ("GET", "/v1/cache/stats"), ("POST", "/tokenize"),
               ("POST", "/detokenize"), ("GET", "/dashboard"), ("GET", "/docs"),
               ("GET", "/redoc"), ("GET", "/openapi.json"), ("POST", "/v1/responses")]  # fmt: skip
    for method, path in guarded:
        response = httpx.request(method, f"{url}{path}", json={})
        assert response.status_code == 401, path
    for path in ("/health", "/ping", "/version", "/metrics"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    tokens = httpx.post(f"{url}/tokenize", json={"prompt": "hi"}, headers=AUTH).json()["tokens"]
    assert httpx.post(f"{url}/detokenize", json={"tokens": tokens}, headers=AUTH).json() == {
        "prompt": "hi"
    }


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"Content-Length: 536870912", b"401"),  # no key
        (b"Transfer-Encoding: chunked", b"401"),
        (b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 536870912", b"413"),
    ],
)
def test_an_upload_is_refused_from_its_headers_before_its_body(
    url: str, head: bytes, status: bytes
) -> None:
    request = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + head + b"\r\n\r\n"
    answer = _answer_to_head(url, request)  # none of the body sent: answered at once
    assert answer.startswith(b"HTTP/1.1 " + status), answer
    assert b"connection: close" in answer.lower()


def test_a_chunked_body_is_cut_off_once_past_the_limit(url: str) -> None:
    with socket.create_connection(_address(url)) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        chunk = b"x" * (LIMIT // 4)
        for _ in range(5):  # one chunk past the limit; the body never ends
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.settimeout(10)
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer


def test_heads_are_bounded_and_hosts_checked(url: str) -> None:
    big = {"x-big": "a" * 9000, **AUTH}
    assert httpx.get(f"{url}/v1/models", headers=big).status_code == 431
    many = {**{f"x-{i}": "a" for i in range(40)}, **AUTH}
    assert httpx.get(f"{url}/v1/models", headers=many).status_code == 431
    rebound = {"Host": "attacker.example", **AUTH}  # DNS rebinding's Host
    refused = httpx.get(f"{url}/v1/models", headers=rebound)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(f"{url}/v1/models", headers={"Host": "localhost", **AUTH}).is_success
    assert httpx.get(f"{url}/health", headers={"Host": "attacker.example"}).is_success


def _prefix_hits(url: str) -> int:
    return int(httpx.get(f"{url}/v1/cache/stats", headers=AUTH).json()["prefix_hits"])


def _complete(url: str, **fields: Any) -> httpx.Response:
    # Two tokens: a request that ends at its prefill leaves no blocks cached.
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=120)


def test_requests_share_cached_prefixes_only_with_the_same_salt(url: str) -> None:
    assert _complete(url, cache_salt="tenant-a").is_success
    before = _prefix_hits(url)
    for salt in ("tenant-b", None):  # another tenant's guess, and an unsalted one
        assert _complete(url, cache_salt=salt).is_success
        assert _prefix_hits(url) == before, salt
    assert _complete(url, cache_salt="tenant-a").is_success
    assert _prefix_hits(url) == before + 2  # the tenant's own prompt again
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
            "cache_salt": "tenant-c"}  # fmt: skip
    for path, body in (("/v1/chat/completions", chat),
                       ("/v1/responses", {"input": PROMPT, "max_output_tokens": 1,
                                          "cache_salt": "tenant-c"})):  # fmt: skip
        assert httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=120).is_success
    response = _complete(url, cache_salt="")
    assert response.status_code == 400 and response.json()["error"]["param"] == "cache_salt"


def test_large_tokenize_requests_are_refused_before_any_work(url: str) -> None:
    hopeless = {"prompt": "word " * 40_000}  # more characters than 2,048 tokens can hold
    for path in ("/tokenize", "/v1/completions"):
        response = httpx.post(f"{url}{path}", json=hopeless, headers=AUTH, timeout=30)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "context_length_exceeded"
    refused = httpx.post(f"{url}/detokenize", json={"tokens": [1] * 2049}, headers=AUTH)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens"


def test_a_strict_schema_names_every_key_of_the_answer(url: str) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"]}  # fmt: skip
    body = {
        "messages": [{"role": "user", "content": "Name a city and its country, as JSON."}],
        "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "city", "schema": schema, "strict": True}},
    }  # fmt: skip
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    answer = json.loads(response.json()["choices"][0]["message"]["content"])
    assert set(answer) == {"city"}


def test_a_tool_message_without_a_call_is_a_400(url: str) -> None:
    tool = {"role": "tool", "content": "21 C", "tool_call_id": "call_1"}
    body = {"messages": [{"role": "user", "content": "hi"}, tool]}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages.1.role"


def test_the_api_reference_loads_nothing_from_elsewhere(url: str) -> None:
    for path in ("/docs", "/redoc"):
        page = httpx.get(f"{url}{path}?api_key={KEY}")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "://" not in page.text  # no CDN, no font, no favicon elsewhere
        assert "default-src 'none'" in page.headers["content-security-policy"]


@pytest.mark.slow
def test_the_browser_draws_every_operation_offline(url: str) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    executable = chromium()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page()
        outside: list[str] = []
        page.on("request", lambda r: None if r.url.startswith(url) else outside.append(r.url))
        page.goto(f"{url}/docs?api_key={KEY}")
        page.wait_for_selector("details.op", timeout=30_000)
        paths = page.locator("details.op .path").all_text_contents()
        browser.close()
    assert "/v1/chat/completions" in paths and "/tokenize" in paths
    assert outside == []
