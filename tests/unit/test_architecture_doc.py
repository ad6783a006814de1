"""docs/ARCHITECTURE.md stays true: every file or folder it names exists, and the README
points to it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# Paths are under src/infer/ unless they start with one of these.
FROM_ROOT = ("src/", "tests/", "benchmarks/", "docs/", "CONTRIBUTING.md", "README.md")
_PATH = re.compile(r"`([A-Za-z_][\w./-]*(?:\.py|\.md|/))`")


def named_paths(text: str) -> list[str]:
    return [p for p in _PATH.findall(text) if "/" in p or p.endswith(".md")]


def resolve(path: str) -> Path:
    return ROOT / path if path.startswith(FROM_ROOT) else ROOT / "src" / "infer" / path


def test_every_path_the_architecture_page_names_exists() -> None:
    paths = named_paths(DOC.read_text())
    assert len(paths) > 40  # the page names the file of every hop
    missing = [p for p in paths if not resolve(p).exists()]
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"


def test_a_moved_file_is_caught() -> None:
    assert not resolve("engine/core/no_such_module.py").exists()
    assert named_paths("see `engine/core/no_such_module.py` and `server/`") == [
        "engine/core/no_such_module.py",
        "server/",
    ]


def test_the_readme_points_to_the_architecture_page() -> None:
    assert "docs/ARCHITECTURE.md" in (ROOT / "README.md").read_text()
