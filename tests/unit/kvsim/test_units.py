"""Memory sizes: decimal and binary units, bare bytes, clear errors."""

from __future__ import annotations

import pytest

from infer.kvsim.units import format_bytes, parse_memory


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * 2**30),
        ("40GB", 40 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("2 kib", 2048),
        ("1048576", 1048576),
        ("7B", 7),
    ],
)
def test_parse_memory(text: str, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "16 gigs", "-4GiB", "0GiB", "16GiBs"])
def test_parse_memory_rejects_with_the_flag_name(text: str) -> None:
    with pytest.raises(ValueError, match=r"^gpu_memory: "):
        parse_memory(text, "gpu_memory")


def test_format_bytes_uses_the_largest_binary_unit() -> None:
    assert format_bytes(32 * 2**20) == "32.0 MiB"
    assert format_bytes(16384) == "16.0 KiB"
    assert format_bytes(3 * 2**40) == "3.0 TiB"
    assert format_bytes(100) == "100 B"
