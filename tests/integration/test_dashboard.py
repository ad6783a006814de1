"""``/dashboard`` in a real headless Chromium, against SmolLM2 on the CPU: the pool's blocks
are drawn, change as a burst runs and finishes, and a shared prefix shows as shared; the
page and its stream need the API key.

Chromium comes from the system packages (``.ci/run`` installs it); without it the browser
test is skipped, except in CI, where it fails. ``INFER_DASHBOARD_SCREENSHOT=docs/dashboard.png``
saves a picture of the page in the middle of the burst (the README's).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.integration.conftest import chromium

from infer.config import EngineConfig
from infer.server import build_server, serve_in_thread

KEY = "sk-dashboard"
AUTH = {"Authorization": f"Bearer {KEY}"}
NUM_BLOCKS = 256
# Four full blocks of 16 tokens that every request of the burst shares.
PREFIX = "You are a helpful assistant. Answer in one short sentence. " * 6
QUESTIONS = ["What is red?", "Name a bird.", "Why is the sky blue?", "Count to three.",
             "What is rain?", "Say hello."]  # fmt: skip
WAIT_MS = 120_000  # a shared two-core CPU runs a step in a second or more


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    config = EngineConfig(
        model="smollm2-135m",
        device="cpu",
        num_gpu_blocks=NUM_BLOCKS,
        max_seq_len=1024,
        max_batch_size=8,
        prefill_chunk_size=32,  # a prompt runs in chunks, as the page shows
        long_prefill_threshold=0,
        use_prefix_caching=True,
    )
    server = build_server(config, port=0, api_key=KEY, log_level="warning")
    with serve_in_thread(server) as base_url:
        yield base_url


def complete(url: str, prompts: list[str], max_tokens: int) -> None:
    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=600) as client:
            answers = await asyncio.gather(
                *(client.post("/v1/completions", json={**body, "prompt": p}) for p in prompts)
            )
        assert [a.status_code for a in answers] == [200] * len(prompts)

    asyncio.run(run())


def test_the_page_and_its_stream_need_the_key(url: str) -> None:
    for path in ("/dashboard", "/dashboard/stream"):
        assert httpx.get(f"{url}{path}").status_code == 401
        assert httpx.get(f"{url}{path}?api_key=wrong").status_code == 401
    page = httpx.get(f"{url}/dashboard?api_key={KEY}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="application/json" id="source">{"live":"/dashboard/stream"}' in page.text
    assert httpx.get(f"{url}/dashboard", headers=AUTH).status_code == 200


def test_the_stream_sends_frames_of_the_pool(url: str) -> None:
    with httpx.stream("GET", f"{url}/dashboard/stream", headers=AUTH, timeout=60) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        line = next(line for line in stream.iter_lines() if line.startswith("data:"))
    frame: dict[str, Any] = json.loads(line.removeprefix("data:"))
    assert frame["numBlocks"] == NUM_BLOCKS and frame["blockSize"] == 16
    assert frame["backend"] == "paged" and frame["chunkSize"] == 32


@pytest.mark.slow
def test_the_browser_draws_blocks_that_change_and_a_shared_prefix(url: str) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    executable = chromium()
    complete(url, [PREFIX + "Hi."], max_tokens=2)  # its prefix blocks stay cached
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/dashboard?api_key={KEY}")
        pool = page.locator("canvas.pool")
        page.wait_for_function(
            "() => document.querySelector('canvas.pool').dataset.blocks", timeout=WAIT_MS
        )
        assert pool.get_attribute("data-blocks") == str(NUM_BLOCKS)
        assert int(pool.get_attribute("data-evictable") or 0) >= 4  # the cached prefix

        burst = threading.Thread(target=complete, args=(url, [PREFIX + q for q in QUESTIONS], 24))
        burst.start()
        try:
            page.wait_for_function(
                """() => {
                    const d = document.querySelector('canvas.pool').dataset;
                    return +d.shared >= 4 && +d.maxRefs >= 2 && +d.private > 0;
                }""",
                timeout=WAIT_MS,
            )
            rows = page.locator("tbody tr[data-id]")
            assert rows.count() >= 2
            rows.first.click()  # highlights its own blocks and the shared ones it holds
            highlighted = int(pool.get_attribute("data-highlighted") or 0)
            assert highlighted > int(pool.get_attribute("data-shared") or 0) > 0
            if path := os.environ.get("INFER_DASHBOARD_SCREENSHOT"):
                page.screenshot(path=path)
        finally:
            burst.join()
        page.wait_for_function(
            """() => {
                const d = document.querySelector('canvas.pool').dataset;
                return +d.private === 0 && +d.shared === 0 && +d.evictable > 4;
            }""",
            timeout=WAIT_MS,
        )
        assert page.locator("tbody tr[data-id]").count() == 0
        assert page.locator(".events li").count() >= 1
        browser.close()
    assert errors == []
