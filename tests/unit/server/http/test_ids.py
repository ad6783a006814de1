"""Response and tool-call ids: the asked number of hex digits, and no two alike."""

from __future__ import annotations

import string

from infer.server.http.ids import random_hex


def test_ids_are_hex_of_the_asked_length_and_distinct() -> None:
    ids = [random_hex(24) for _ in range(1000)]
    assert all(len(i) == 24 and set(i) <= set(string.hexdigits.lower()) for i in ids)
    assert len(set(ids)) == len(ids)
