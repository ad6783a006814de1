"""Where a benchmark ran and where its results go.

Every result records the GPU, git commit (``INFER_GIT_COMMIT`` overrides it where the
checkout has no ``.git``), date and library versions next to its numbers, so each number in
``benchmarks/RESULTS.md`` and ``benchmarks/results-by-topic/`` can be traced to the run and
the code that produced it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

_GIT_COMMIT_ENV = "INFER_GIT_COMMIT"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str:
    """``HEAD``'s hash, with ``+dirty`` when tracked files have uncommitted changes."""
    if os.environ.get(_GIT_COMMIT_ENV):
        return os.environ[_GIT_COMMIT_ENV]
    commit = _git("rev-parse", "--short=12", "HEAD")
    if commit is None:
        return "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return commit + ("+dirty" if dirty else "")


def gpu_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()})"


def timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def environment() -> dict[str, Any]:
    """The machine and code a result came from."""
    import transformers

    return {
        "gpu": gpu_name(),
        "git_commit": git_commit(),
        "date": timestamp(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "command": command_line(),
    }


def command_line() -> str:
    """How this process was started (``python -c 'from infer.cli import main...'`` and the
    ``infer`` script both read as ``infer ...``)."""
    program = sys.argv[0]
    if program == "-c" or Path(program).name == "infer":
        return shlex.join(["infer", *sys.argv[1:]])
    return shlex.join(sys.argv)


def results_dir() -> Path:
    """``benchmarks/results`` of the checkout (of the current directory without git)."""
    top = _git("rev-parse", "--show-toplevel")
    return Path(top or ".") / "benchmarks" / "results"


def output_paths(
    output: str | None, model: str, runs: list[str], engines: list[str], date: str
) -> tuple[dict[tuple[str, str], Path], dict[str, Path]]:
    """JSON path of each (run, engine) and plot path of each run (a run: a workload, or its
    ``infer.bench.sampling.run_names`` name).

    Default: ``benchmarks/results/<model>-<run>-<date>-<engine>.json`` and
    ``...-<date>.png``. ``--output F``: ``F`` itself when the run makes one result, else
    ``F`` less a trailing ``.json``, extended with the run and engine.
    """
    json_paths: dict[tuple[str, str], Path] = {}
    plot_paths: dict[str, Path] = {}
    one_result = len(runs) == 1 and len(engines) == 1
    for run in runs:
        if output is None:
            stem = results_dir() / "-".join(_slug(p) for p in (model, run, date))
        else:
            # Only ``.json`` goes: a model's dots (``llama-3.2-3b``) are part of the name.
            stem = Path(output)
            stem = stem.with_name(stem.name.removesuffix(".json"))
            if len(runs) > 1:
                stem = stem.with_name(f"{stem.name}-{_slug(run)}")
        plot_paths[run] = stem.with_name(stem.name + ".png")
        for engine in engines:
            json_paths[run, engine] = (
                Path(output)
                if output is not None and one_result
                else stem.with_name(f"{stem.name}-{engine}.json")
            )
    return json_paths, plot_paths


def write_json(record: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "output_tok_s" not in data:
        raise ValueError(f"{path}: not a benchmark result (no output_tok_s)")
    return data


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(text).name if "/" in text else text).strip("_")
