"""Start-up to ready of a server, and what its log says the time went into.

A server is started as a child process whose output (stdout and stderr together) is read
line by line and stamped with the seconds since launch, then written to a log file. Ready =
``GET /health`` answers 200. Markers pick lines out of the log: a pattern with a group reads
a duration the server reports itself (vLLM logs "Loading weights took 0.52 seconds", ...); a
pattern without one records when its line arrived (``infer serve``'s log has no timestamps
and no lines for model load, tokenizer, warm-up or graph capture: only the KV-cache size,
logged once the model is loaded and memory profiled, and uvicorn's start).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx


@dataclass(frozen=True)
class Marker:
    """A log line that says where start-up time went."""

    label: str
    pattern: str  # with a group: the server's own duration (s); without: when the line came


INFER_MARKERS = (
    Marker("first log line (imports done)", r"\S"),
    Marker("weights loaded in", r"start-up: \S+: load the weights in ([\d.]+) s"),
    Marker("KV cache sized in", r"start-up: \S+: size the KV cache in ([\d.]+) s"),
    Marker("step kernels warmed up in", r"start-up: \S+: warm up the step kernels in ([\d.]+) s"),
    Marker(
        "waited for the sampling kernels",
        r"start-up: wait for the sampling kernels.* in ([\d.]+) s",
    ),
    Marker("CUDA graphs captured in", r"start-up: \S+: capture \d+ CUDA graphs in ([\d.]+) s"),
    Marker("first traffic rehearsed in", r"start-up: warm-up .*: all parts in ([\d.]+) s"),
    Marker("HTTP listening (ready)", r"Uvicorn running on"),
)
VLLM_MARKERS = (
    Marker("weights loaded in", r"Loading weights took ([\d.]+) seconds"),
    Marker("model loaded in", r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds"),
    Marker("torch.compile in", r"torch\.compile took ([\d.]+) s in total"),
    Marker("profiling / warm-up run in", r"Initial profiling/warmup run took ([\d.]+) s"),
    Marker("CUDA graph capture in", r"Graph capturing finished in ([\d.]+) secs"),
    Marker(
        "engine init (profile, KV cache, warm-up) in",
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    ),
    Marker("HTTP listening", r"Application startup complete"),
)


def find_markers(
    lines: Sequence[tuple[float, str]], markers: Sequence[Marker]
) -> dict[str, dict[str, Any]]:
    """The first line matching each marker, as ``{label: {"s": seconds, "kind": "duration"
    | "at"}}`` (``at``: when the line came, seconds since launch); unmatched ones left out."""
    found: dict[str, dict[str, Any]] = {}
    for marker in markers:
        pattern = re.compile(marker.pattern)
        for at, line in lines:
            match = pattern.search(line)
            if match:
                if match.groups():
                    found[marker.label] = {"s": float(match.group(1)), "kind": "duration"}
                else:
                    found[marker.label] = {"s": round(at, 2), "kind": "at"}
                break
    return found


def describe_markers(found: Mapping[str, Mapping[str, Any]]) -> str:
    """``label 12.3 s; label at 45.6 s`` (durations, then moments since launch)."""
    if not found:
        return "no markers in the log"
    return "; ".join(
        f"{label} {'at ' if entry['kind'] == 'at' else ''}{entry['s']:.1f} s"
        for label, entry in found.items()
    )


@dataclass
class LoggedProcess:
    """A child process whose output lines are kept with the seconds since launch."""

    process: subprocess.Popen[str]
    started: float
    log_file: TextIO
    lines: list[tuple[float, str]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @classmethod
    def start(
        cls, command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> LoggedProcess:
        """Launch ``command``; its output goes to ``log_path`` as ``[  12.345] line``.

        Text mode reads carriage returns as line ends, so progress bars become lines."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "w")  # noqa: SIM115 - closed by stop()
        started = time.monotonic()
        process = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=None if env is None else dict(env),
            process_group=0,  # stop() ends the server's own children too (GPU memory)
        )
        logged = cls(process, started, log_file)
        logged._reader = threading.Thread(target=logged._read, daemon=True)
        logged._reader.start()
        return logged

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.rstrip("\n")
            at = time.monotonic() - self.started
            self.lines.append((at, line))
            self.log_file.write(f"[{at:9.3f}] {line}\n")
            self.log_file.flush()

    def tail(self, count: int = 30) -> str:
        return "\n".join(line for _, line in self.lines[-count:])

    def wait_ready(self, url: str, timeout_s: float) -> float:
        """Seconds from launch until ``GET {url}/health`` answers 200; ``RuntimeError`` with
        the log's tail if the process exits or the time runs out first."""
        deadline = self.started + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({self.process.returncode}) before it was ready:\n"
                    + self.tail()
                )
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the server was not ready after {timeout_s:.0f} s:\n" + self.tail())

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM to the process and its children (a graceful shutdown), SIGKILL after
        ``grace_s``; the exit code."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(grace_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # children that outlived the server
            os.killpg(self.process.pid, signal.SIGKILL)
        if self._reader is not None:
            self._reader.join(grace_s)
        self.log_file.close()
        return self.process.returncode
