"""Lab 0.3, chapter 1: K/V computations with and without a cache."""

from __future__ import annotations

import pytest

from infer.kvsim.lab import (
    explain_cache,
    explanation_to_json,
    format_explanation,
    kv_computations_without_cache,
)


def test_lab_example_counts_what_its_formula_gives() -> None:
    explanation = explain_cache(128, 100)
    assert explanation.without_cache == 17_978  # not the 16,576 the lab prints
    assert explanation.with_cache == 228
    assert "17,978" in format_explanation(explanation)
    assert '"without_cache": 17978' in explanation_to_json(explanation)


@pytest.mark.parametrize(("prompt", "generated"), [(1, 0), (1, 1), (7, 13), (128, 100), (5, 999)])
def test_closed_form_is_the_labs_loop(prompt: int, generated: int) -> None:
    total = prompt  # the lab's attention_without_cache, line by line
    for step in range(1, generated + 1):
        total += prompt + step
    assert kv_computations_without_cache(prompt, generated) == total


def test_bad_lengths_name_the_flag() -> None:
    with pytest.raises(ValueError, match=r"^prompt: "):
        explain_cache(0, 10)
    with pytest.raises(ValueError, match=r"^generate: "):
        explain_cache(10, -1)
