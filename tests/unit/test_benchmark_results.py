"""The benchmark results stay readable and light: RESULTS.md links one file per topic, every
relative link in the results documents resolves, and no raw file in git is bulky and
uncompressed (every clone and every copy of the tree to a GPU host carries them)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
TOPICS = BENCHMARKS / "results-by-topic"
RAW_LIMIT_BYTES = 100_000
COMPRESSED = (".gz", ".png")
READ_BY_CODE = {"scoreboard.json"}  # infer.bench.scoreboard reads and rewrites it as it is
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(document: Path) -> list[str]:
    links = [m.group(1).split("#")[0] for m in LINK.finditer(document.read_text())]
    return [link for link in links if link and "://" not in link]


def _documents() -> list[Path]:
    return [BENCHMARKS / "RESULTS.md", BENCHMARKS / "README.md", *sorted(TOPICS.glob("*.md"))]


def test_results_page_links_every_topic_file_in_order() -> None:
    linked = [
        link
        for link in _relative_links(BENCHMARKS / "RESULTS.md")
        if link.startswith("results-by-topic/") and link.endswith(".md")
    ]
    files = sorted(f"results-by-topic/{path.name}" for path in TOPICS.glob("*.md"))
    assert linked == files
    numbers = [int(Path(link).name.split("-")[0]) for link in linked]
    assert numbers == list(range(1, len(numbers) + 1))


def test_each_topic_file_holds_its_own_sections() -> None:
    for path in TOPICS.glob("*.md"):
        topic = int(path.name.split("-")[0])
        text = path.read_text()
        assert text.startswith(f"# {topic}. "), path.name
        sections = re.findall(r"^## (\d+)\.\d+ ", text, flags=re.MULTILINE)
        assert sections and {int(number) for number in sections} == {topic}, path.name


def test_relative_links_in_the_results_documents_resolve() -> None:
    broken = [
        f"{document.relative_to(BENCHMARKS)}: {link}"
        for document in _documents()
        for link in _relative_links(document)
        if not (document.parent / link).exists()
    ]
    assert broken == []


def test_no_bulky_uncompressed_raw_file_is_tracked() -> None:
    git = shutil.which("git")
    root = BENCHMARKS.parent
    if git is None or not (root / ".git").exists():
        pytest.skip("not a git checkout: what is tracked is unknown")
    listed = subprocess.run(
        [git, "ls-files", "-z", "benchmarks/results"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    bulky = [
        name
        for name in listed.split("\0")
        if name
        and not name.endswith(COMPRESSED)
        and Path(name).name not in READ_BY_CODE
        and (root / name).is_file()
        and (root / name).stat().st_size > RAW_LIMIT_BYTES
    ]
    assert bulky == [], "gzip them (gzip -9n FILE) and cite the .gz names"
