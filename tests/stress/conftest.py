"""Every test under ``tests/stress`` is a load loop: marked ``stress``, so that ``make test``
leaves it out and ``make test-stress`` (which CI runs after it) runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.stress)
