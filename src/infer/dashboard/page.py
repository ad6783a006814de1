"""The dashboard page as one HTML document: ``static/dashboard.html`` with its style and
script inlined, and what the script shows (a live stream, or recorded frames) embedded.

One document, no other files: the server sends it behind ``--api-key`` like any endpoint
(a browser cannot add a key to the requests for a page's scripts), and ``kvsim --html``
writes it as a file that opens anywhere."""

from __future__ import annotations

import json
import re
from importlib.resources import files
from typing import Any

_STATIC = files("infer.dashboard") / "static"
_SLOT = re.compile(r"/\*\{\{(\w+)\}\}\*/|\{\{(\w+)\}\}")


def render_page(title: str, source: dict[str, Any]) -> str:
    """The page titled ``title``; ``source`` tells its script where frames come from:
    ``{"live": stream URL}`` or ``{"replay": [{"name": ..., "frames": [...]}, ...]}``."""
    html = (_STATIC / "dashboard.html").read_text(encoding="utf-8")
    style = (_STATIC / "dashboard.css").read_text(encoding="utf-8")
    script = (_STATIC / "dashboard.js").read_text(encoding="utf-8")
    slots = {
        "title": _escape(title),
        "style": style,
        "script": script,
        "source": json.dumps(source, separators=(",", ":")).replace("</", "<\\/"),
    }
    # One pass, so that nothing filled in is read as a slot (a title, a request id).
    return _SLOT.sub(lambda m: slots[m.group(1) or m.group(2)], html)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
