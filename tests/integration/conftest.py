"""A server over the embedded SmolLM2 for the HTTP tests, one per test process: the modules
that use it only read from it (a module that needs other settings builds its own ``url``)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer.server import build_server, serve_in_thread


@pytest.fixture(scope="session")
def url(smollm2_config: Any) -> Iterator[str]:
    server = build_server(smollm2_config, port=0, log_level="warning")
    with serve_in_thread(server) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def metric(url: str, name: str, default: float | None = None) -> float:
    """A sample's value, summed over its labels; ``default`` for one not shown yet (a
    labelled counter before its first label, e.g. finished requests before any finished)."""
    text = httpx.get(f"{url}/metrics").text
    values = [
        float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]
    if values:
        return sum(values)
    if default is None:
        raise KeyError(name)
    return default


def chromium() -> str:
    """The system Chromium for browser tests: skipped without it, except in CI (``.ci/run``
    installs it), where a missing browser fails the test."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing (.ci/run installs it)")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return path


def stream_events(
    url: str, body: dict[str, object], events: list[str], headers: dict[str, str] | None = None
) -> None:
    """Stream a completion from the server at ``url``, appending each SSE ``data:`` line."""
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=headers, timeout=60
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line)


def started_stream(
    url: str, body: dict[str, object], headers: dict[str, str] | None = None
) -> tuple[threading.Thread, list[str]]:
    """A streamed completion in a thread of its own, once its first event has come."""
    events: list[str] = []
    thread = threading.Thread(target=stream_events, args=(url, body, events, headers))
    thread.start()
    while not events:
        time.sleep(0.02)
    return thread, events
