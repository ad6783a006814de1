"""A server over the embedded SmolLM2 for the HTTP tests, one per test module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from infer.server import build_server, serve_in_thread


@pytest.fixture(scope="module")
def url(smollm2_llm: Any) -> Iterator[str]:
    server = build_server(smollm2_llm.config, port=0, log_level="warning")
    with serve_in_thread(server) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
