"""The server's API process loads no torch, transformers or llguidance by importing the HTTP
app or ``infer serve``'s launcher: the engine process is started by module path
(``server/bridge/engine_client.py``), and what both share is ``infer.contract``."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "llguidance")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys; {code}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(
    "code",
    [
        "import infer.server.http.api",
        "from infer.server import create_app, build_server",
        "from infer.cli import build_parser; build_parser('serve'); import infer.cli.serve; "
        "import infer.server.bridge.launch",
    ],
    ids=["http-app", "server-package", "infer-serve"],
)
def test_the_api_process_imports_no_engine(code: str) -> None:
    assert _loaded_after(code) == []
