"""Memory sizes as people write them (``16GiB``, ``40GB``, ``512MiB``) and as we print them."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_memory(text: str, flag: str = "memory") -> int:
    """Bytes in ``text``: decimal units (``KB``, ``MB``, ``GB``, ``TB``) are powers of 1000,
    binary ones (``KiB``, ``MiB``, ``GiB``, ``TiB``) powers of 1024; a bare number is bytes.

    ``ValueError`` naming ``flag`` for anything else or for a size that is not positive.
    """
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{flag}: {text!r} is not a memory size (examples: 16GiB, 40GB, 512MiB, 1048576)"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{flag}: must be positive, got {text!r}")
    return size


def format_bytes(size: float) -> str:
    """``size`` in the largest binary unit that keeps it at or above 1 (``32.0 MiB``)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"
