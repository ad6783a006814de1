"""Benchmark sampling settings: labels round-trip, bad values name their field, and the vLLM
peer gets the same settings in its own terms."""

from __future__ import annotations

import argparse

import pytest

from infer.bench.sampling import (
    GREEDY,
    BenchSampling,
    add_sampling_args,
    run_name,
    run_names,
    samplings_from_args,
)
from infer.bench.vllm_peer import _vllm_sampling


@pytest.mark.parametrize(
    "label", ["greedy", "t1", "t0.7-p0.9", "t1-k50", "t0.8-p0.95-k40-minp0.05"]
)
def test_a_label_names_its_settings_and_back(label: str) -> None:
    assert BenchSampling.from_label(label).label == label


def test_labels_and_values_that_are_wrong_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"^sampling:"):
        BenchSampling.from_label("t1-q3")
    with pytest.raises(ValueError, match=r"^top_p:"):
        BenchSampling(temperature=1.0, top_p=0.0)


def test_several_settings_or_the_single_flags() -> None:
    parser = argparse.ArgumentParser()
    add_sampling_args(parser)
    assert samplings_from_args(parser.parse_args([])) == [GREEDY]
    flags = parser.parse_args(["--temperature", "0.7", "--top-p", "0.9"])
    assert samplings_from_args(flags) == [BenchSampling(0.7, 0.9)]
    several = samplings_from_args(parser.parse_args(["--sampling", "greedy,t1-k50"]))
    assert several == [GREEDY, BenchSampling(1.0, top_k=50)]
    with pytest.raises(ValueError, match=r"^sampling:"):
        samplings_from_args(parser.parse_args(["--sampling", "t1", "--temperature", "1"]))
    assert run_name("burst256", several[1]) == "burst256-t1-k50"
    assert run_name("burst256", GREEDY) == "burst256"


def test_a_repeated_label_names_each_of_its_runs() -> None:
    t1 = BenchSampling(1.0)
    names = run_names(["burst256", "single"], [GREEDY, t1, GREEDY, t1, t1])
    assert names == [
        "burst256", "burst256-t1", "burst256-2", "burst256-t1-2", "burst256-t1-3",
        "single", "single-t1", "single-2", "single-t1-2", "single-t1-3",
    ]  # fmt: skip


def test_the_vllm_peer_gets_the_same_settings() -> None:
    assert _vllm_sampling(BenchSampling(0.7, 0.9)) == {
        "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0,
    }  # fmt: skip
    assert _vllm_sampling(BenchSampling(1.0, top_k=50))["top_k"] == 50
