"""The scoreboard: the latest value of every headline figure, in one file.

``benchmarks/results/scoreboard.json`` maps a name (``offline/llama-3.2-3b/burst256/infer/
output_tok_s``, ``serving/llama-3.2-3b/chat/greedy/vllm/ttft_p50_ms``, ...) to ``{value,
unit, sampling, command, commit, gpu, date}`` (``sampling``: what the measured requests asked
for). The scripts that measure call ``update`` after each run, so the newest number of each
kind is in one place, with where it came from, whichever script made it.
Runs that scale or cap a workload (smoke tests) are not headline figures and are not recorded.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infer.bench.results import command_line, git_commit, gpu_name, results_dir, timestamp

FILENAME = "scoreboard.json"


def scoreboard_path() -> Path:
    """``benchmarks/results/scoreboard.json`` of the checkout (``INFER_SCOREBOARD`` overrides:
    tests, or a device machine that copies it back from elsewhere)."""
    return Path(os.environ.get("INFER_SCOREBOARD") or results_dir() / FILENAME)


def read(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every entry (empty when there is no scoreboard yet)."""
    path = path or scoreboard_path()
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a scoreboard (a JSON object of entries)")
    return data


def update(
    name: str,
    value: float,
    unit: str,
    *,
    sampling: str,
    command: str | None = None,
    commit: str | None = None,
    gpu: str | None = None,
    date: str | None = None,
    path: Path | None = None,
) -> dict[str, Any]:
    """Set entry ``name`` (the others stay as they are); missing provenance is this process's
    command line, commit, GPU and the current time. Returns the entry written."""
    provenance = {"command": command, "commit": commit, "gpu": gpu, "date": date}
    return update_many({name: (value, unit)}, sampling=sampling, path=path, **provenance)[name]


def update_many(
    values: dict[str, tuple[float, str]],
    *,
    sampling: str,
    command: str | None = None,
    commit: str | None = None,
    gpu: str | None = None,
    date: str | None = None,
    path: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """``update`` for several ``name: (value, unit)`` of one run, in one rewrite.

    The file is rewritten atomically (a temporary file renamed over it) under an exclusive
    lock, so concurrent runs (``--engine infer,vllm`` children) neither lose each other's
    entries nor leave a half-written file."""
    for name in values:
        if not name or name != name.strip():
            raise ValueError(f"name: must be non-empty without outer spaces, got {name!r}")
    path = path or scoreboard_path()
    provenance = {
        "command": command if command is not None else command_line(),
        "commit": commit if commit is not None else git_commit(),
        "gpu": gpu if gpu is not None else gpu_name(),
        "date": date if date is not None else timestamp(),
    }
    written = {
        name: {"value": round(float(value), 4), "unit": unit, "sampling": sampling, **provenance}
        for name, (value, unit) in values.items()
    }
    with _locked(path):
        entries = {**read(path), **written}
        _write_atomically(path, json.dumps(dict(sorted(entries.items())), indent=1) + "\n")
    return written


def summary_values(prefix: str, summary: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """The headline figures of a harness summary (``metrics.summarize``): output tok/s,
    TTFT p50 and ITL p99, named ``<prefix>/output_tok_s`` and so on."""
    values = {f"{prefix}/output_tok_s": (float(summary["output_tok_s"]), "tok/s")}
    for key, stat, label in (("ttft_ms", "p50", "ttft_p50_ms"), ("itl_ms", "p99", "itl_p99_ms")):
        value = (summary.get(key) or {}).get(stat)
        if value is not None:
            values[f"{prefix}/{label}"] = (float(value), "ms")
    return values


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on the scoreboard's folder (no lock file left behind)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # releases the lock


def _write_atomically(path: Path, text: str) -> None:
    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as f:
            f.write(text)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
