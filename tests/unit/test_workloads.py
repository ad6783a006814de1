"""Workloads: deterministic, the seeds' shapes and arrival patterns, safe token ids."""

from __future__ import annotations

import itertools
import statistics

import pytest

from infer.workloads import (
    SHARED_PREFIX_TOKENS,
    WORKLOADS,
    make_workload,
    parse_workload_names,
)

VOCAB = 128256


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_same_seed_same_requests_other_seed_other_prompts(name: str) -> None:
    first = make_workload(name, VOCAB, seed=3)
    assert first == make_workload(name, VOCAB, seed=3)
    other = make_workload(name, VOCAB, seed=4)
    assert [r.prompt_token_ids for r in other.requests] != [
        r.prompt_token_ids for r in first.requests
    ]


@pytest.mark.parametrize(
    ("name", "count", "prompt_range", "output_range", "sequential"),
    [
        ("baseline", 10, (256, 256), (256, 256), True),
        ("continuous_batching", 32, (64, 512), (64, 256), False),
        ("paged_attention", 48, (128, 384), (128, 256), False),
        ("chunked_prefill", 48, (64, 2048), (64, 256), False),
        (
            "prefix_caching",
            48,
            (SHARED_PREFIX_TOKENS + 32, SHARED_PREFIX_TOKENS + 128),
            (256, 256),
            False,
        ),
        ("burst256", 256, (128, 384), (256, 256), False),
        ("single", 1, (128, 128), (512, 512), True),
        ("long_prompt", 3, (8192, 131072 - 64), (16, 16), True),
        ("long_decode", 16, (32768, 32768), (256, 256), False),
        ("long_mix", 40, (128, 16384), (64, 1024), False),
    ],
)
def test_shapes(
    name: str,
    count: int,
    prompt_range: tuple[int, int],
    output_range: tuple[int, int],
    sequential: bool,
) -> None:
    workload = make_workload(name, VOCAB)
    assert len(workload.requests) == count
    assert workload.sequential is sequential
    for request in workload.requests:
        assert prompt_range[0] <= len(request.prompt_token_ids) <= prompt_range[1]
        assert output_range[0] <= request.max_tokens <= output_range[1]


def test_arrival_patterns() -> None:
    assert make_workload("burst256", VOCAB).is_burst
    assert make_workload("paged_attention", VOCAB).is_burst
    assert not make_workload("single", VOCAB).is_burst  # sequential, not a burst
    staggered = [r.arrival_s for r in make_workload("continuous_batching", VOCAB).requests]
    assert staggered == pytest.approx([i * 0.25 for i in range(32)])
    prefix = [r.arrival_s for r in make_workload("prefix_caching", VOCAB).requests]
    assert prefix == pytest.approx([i * 0.125 for i in range(48)])
    poisson = [r.arrival_s for r in make_workload("chunked_prefill", VOCAB, 600).requests]
    gaps = [b - a for a, b in itertools.pairwise(poisson)]
    assert poisson[0] == 0.0 and min(gaps) > 0.0
    assert statistics.mean(gaps) == pytest.approx(1 / 6, rel=0.15)


def test_chunked_prefill_mixes_long_and_short_prompts() -> None:
    lengths = [len(r.prompt_token_ids) for r in make_workload("chunked_prefill", VOCAB).requests]
    long = [n for n in lengths if n >= 1024]
    assert all(n >= 1024 or n <= 128 for n in lengths)
    assert 0.5 < len(long) / len(lengths) < 0.95


def test_prefix_caching_shares_the_prefix_only() -> None:
    requests = make_workload("prefix_caching", VOCAB).requests
    prefix = requests[0].prompt_token_ids[:SHARED_PREFIX_TOKENS]
    assert all(r.prompt_token_ids[:SHARED_PREFIX_TOKENS] == prefix for r in requests)
    suffixes = {tuple(r.prompt_token_ids[SHARED_PREFIX_TOKENS:]) for r in requests}
    assert len(suffixes) == len(requests)


@pytest.mark.parametrize(("vocab", "low", "high"), [(320, 32, 320), (VOCAB, 1000, 20000)])
def test_token_ids_avoid_the_vocabulary_ends(vocab: int, low: int, high: int) -> None:
    ids = [t for r in make_workload("burst256", vocab).requests for t in r.prompt_token_ids]
    assert min(ids) >= low and max(ids) < high
    assert max(ids) - min(ids) > (high - low) * 0.9  # the whole range is used


def test_num_requests_scales_down_and_up() -> None:
    assert len(make_workload("burst256", VOCAB, num_requests=3).requests) == 3
    single = make_workload("single", VOCAB, num_requests=4)
    assert len(single.requests) == 4 and single.sequential
    staggered = make_workload("continuous_batching", VOCAB, num_requests=100).requests
    assert staggered[-1].arrival_s == pytest.approx(99 * 0.25)  # same rate, longer run


def test_capped_cuts_outputs_only() -> None:
    workload = make_workload("paged_attention", VOCAB, num_requests=5)
    capped = workload.capped(100)
    assert [r.max_tokens for r in capped.requests] == [100] * 5
    assert [r.prompt_token_ids for r in capped.requests] == [
        r.prompt_token_ids for r in workload.requests
    ]
    assert capped.max_sequence_len == max(len(r.prompt_token_ids) for r in capped.requests) + 100


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="workload: unknown 'nope'"):
        make_workload("nope", VOCAB)
    with pytest.raises(ValueError, match="num_requests"):
        make_workload("burst256", VOCAB, num_requests=0)
    with pytest.raises(ValueError, match="vocab_size"):
        make_workload("burst256", 8)
    with pytest.raises(ValueError, match="workload: unknown 'x'"):
        parse_workload_names("single,x")
    assert parse_workload_names(" burst256, single ") == ["burst256", "single"]


def test_long_prompts_and_the_long_mix() -> None:
    lengths = [len(r.prompt_token_ids) for r in make_workload("long_prompt", VOCAB).requests]
    assert lengths == [8192, 32768, 131072 - 64]
    mix = make_workload("long_mix", VOCAB).requests
    short, long = mix[:32], mix[32:]
    assert all(r.arrival_s == 0.0 and len(r.prompt_token_ids) == 128 for r in short)
    assert [r.arrival_s for r in long] == pytest.approx([2.0 + i for i in range(8)])
    assert {len(r.prompt_token_ids) for r in long} == {16384}
    assert make_workload("long_mix", VOCAB).groups == ["short"] * 32 + ["long"] * 8
