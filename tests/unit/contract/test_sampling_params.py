"""A request's samples: one is the request's own parameters (validated once, when made);
several each get their own seed stream, still validated."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infer.contract.sampling_params import SamplingParams


def test_the_only_sample_is_the_parameters_themselves() -> None:
    params = SamplingParams(temperature=0.5, seed=7, stop=["x"], max_tokens=4)
    assert params.nth_sample(0) is params
    assert params.nth_sample(0) == replace(params, n=1, seed=7)  # what it was made as


def test_each_of_n_samples_has_its_own_seed_stream() -> None:
    params = SamplingParams(n=3, temperature=0.5, seed=7, stop=["x"], max_tokens=4)
    samples = [params.nth_sample(i) for i in range(3)]
    assert [s.seed for s in samples] == [7, 8, 9] and all(s.n == 1 for s in samples)
    assert samples[1] == replace(params, n=1, seed=8)
    unseeded = SamplingParams(n=2)
    assert unseeded.nth_sample(1) == replace(unseeded, n=1)


def test_a_samples_seed_past_64_bits_is_refused() -> None:
    params = SamplingParams(n=2, seed=2**63 - 1)
    assert params.nth_sample(0).seed == 2**63 - 1
    with pytest.raises(ValueError, match="seed: must be a non-negative 64-bit integer"):
        params.nth_sample(1)
