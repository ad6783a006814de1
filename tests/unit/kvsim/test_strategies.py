"""Strategy names and the pools built for a memory budget."""

from __future__ import annotations

import pytest

from infer.kvsim.dynamic import FirstFitPool
from infer.kvsim.footprint import load_footprint
from infer.kvsim.naive import NaivePool
from infer.kvsim.paged import PagedPool
from infer.kvsim.strategies import STRATEGIES, build_pool, parse_strategies
from infer.kvsim.window import WindowedPool


def test_parse_strategies() -> None:
    assert parse_strategies("naive, paged") == ["naive", "paged"]
    assert parse_strategies(",".join(STRATEGIES)) == list(STRATEGIES)
    with pytest.raises(ValueError, match=r"^strategies: unknown 'buddy'"):
        parse_strategies("paged,buddy")
    with pytest.raises(ValueError, match=r"^strategies: "):
        parse_strategies(" , ")


@pytest.mark.parametrize(
    ("strategy", "kind"),
    [
        ("naive", NaivePool),
        ("dynamic", FirstFitPool),
        ("paged", PagedPool),
        ("paged+prefix", PagedPool),
        ("paged+window", WindowedPool),
    ],
)
def test_every_pool_spends_the_same_memory(strategy: str, kind: type) -> None:
    footprint = load_footprint("gemma-3-1b")
    memory = 3 << 30
    pool = build_pool(strategy, footprint, memory, 16, 2048)
    spent = pool.num_blocks * pool.bytes_per_block
    assert memory - footprint.block_bytes(16) < spent <= memory
    assert isinstance(pool, kind)


def test_memory_below_one_block_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^memory: "):
        build_pool("paged", load_footprint("lab"), 1000, 16, 2048)
