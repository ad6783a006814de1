"""``infer kvsim --html`` in a real headless Chromium: every strategy's pool is drawn from
the embedded frames, the slider replays them on one clock, and only ``paged+prefix`` shows
shared blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.conftest import chromium

from infer.cli import main

STRATEGIES = ["naive", "dynamic", "paged", "paged+prefix"]


def test_the_replay_draws_each_strategy_and_the_shared_prefix(tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    executable = chromium()
    path = tmp_path / "kvsim.html"
    assert main(["kvsim", "--model", "lab", "--memory", "512MiB", "--workload", "shared-prefix",
                 "--num-requests", "16", "--strategies", ",".join(STRATEGIES),
                 "--html", str(path)]) == 0  # fmt: skip
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        drawn = "n => document.querySelectorAll('canvas.pool[data-blocks]').length === n"
        page.wait_for_function(drawn, arg=len(STRATEGIES))
        pools = {name: page.locator(f'section[data-name="{name}"] canvas.pool')
                 for name in STRATEGIES}  # fmt: skip

        def counts(kind: str) -> dict[str, int]:
            return {name: int(pool.get_attribute(f"data-{kind}") or 0)
                    for name, pool in pools.items()}  # fmt: skip

        # The end of the run: every request has finished.
        assert set(counts("private").values()) == set(counts("shared").values()) == {0}
        end = max(float(pool.get_attribute("data-t") or 0) for pool in pools.values())
        page.eval_on_selector(
            "#scrub", "e => { e.value = 300; e.dispatchEvent(new Event('input')) }"
        )
        shown = "t => [...document.querySelectorAll('canvas.pool')].every(c => +c.dataset.t < t)"
        page.wait_for_function(shown, arg=0.31 * end)  # the slider's 300 of 1000
        held = counts("private")
        assert all(held[name] > 0 for name in STRATEGIES)  # requests run in every pool
        shared = counts("shared")
        assert shared["paged+prefix"] > 0 and shared["paged"] == shared["naive"] == 0
        assert held["naive"] > held["paged"]  # whole slots reserved per request
        browser.close()
    assert errors == []
