import pytest

from infer.routing.prefix_index import PrefixIndex


def test_match_counts_leading_blocks_only() -> None:
    index = PrefixIndex(capacity=100)
    index.insert([1, 2, 3])
    assert index.match([1, 2, 3, 4]) == 3
    assert index.match([1, 9, 3]) == 1
    assert index.match([9, 2, 3]) == 0
    assert index.match([]) == 0


def test_the_least_recently_used_blocks_are_forgotten_first() -> None:
    index = PrefixIndex(capacity=4)
    index.insert([1, 2])
    index.insert([3, 4])
    index.insert([1, 2])  # used again: now the most recent
    index.insert([5, 6])
    assert len(index) == 4
    assert index.match([1, 2]) == 2
    assert index.match([3]) == 0 and index.match([4]) == 0


def test_a_prompt_longer_than_the_capacity_keeps_its_head() -> None:
    index = PrefixIndex(capacity=3)
    index.insert(list(range(10)))
    assert len(index) == 3
    assert index.match(list(range(10))) == 3


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        PrefixIndex(capacity=0)
