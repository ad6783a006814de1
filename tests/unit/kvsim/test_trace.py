"""Workloads and JSONL traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer.kvsim.trace import TokenIds, TraceRequest, describe_workloads, make_trace
from infer.workloads import WORKLOADS as BENCH_WORKLOADS


def test_lab_workload_is_the_labs_sequences() -> None:
    trace = make_trace("lab")
    assert len(trace.requests) == 16
    assert all(100 <= r.prompt_tokens <= 500 and r.output_tokens == 1 for r in trace.requests)
    assert all(r.arrival_s == 0.0 for r in trace.requests)
    assert len(make_trace("lab", num_requests=600).requests) == 600


def test_workloads_are_reproducible_per_seed() -> None:
    assert make_trace("churn", seed=3) == make_trace("churn", seed=3)
    assert make_trace("churn", seed=3) != make_trace("churn", seed=4)


def test_generated_traces_arrive_in_order() -> None:
    for name in ("churn", "shared-prefix", "continuous_batching", "chunked_prefill"):
        arrivals = [r.arrival_s for r in make_trace(name).requests]
        assert arrivals == sorted(arrivals)


def test_every_seed_benchmark_workload_is_available() -> None:
    names = describe_workloads()
    for name in (*BENCH_WORKLOADS, "lab", "shared-prefix", "churn"):
        assert name in names
    assert make_trace("baseline").sequential
    assert not make_trace("paged_attention").sequential


def test_benchmark_prompts_keep_their_token_ids_and_shared_prefix() -> None:
    trace = make_trace("prefix_caching", num_requests=3)
    first, second = (r.token_ids for r in trace.requests[:2])
    common = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert common >= 1024  # the benchmark's shared prefix
    assert all(r.prompt_tokens == len(r.token_ids) for r in trace.requests)


def test_token_ids_share_exactly_the_declared_prefix() -> None:
    ids = TokenIds()
    a = ids.prompt(TraceRequest(0.0, 40, 1, "sys", 32))
    b = ids.prompt(TraceRequest(0.0, 50, 1, "sys", 32))
    c = ids.prompt(TraceRequest(0.0, 40, 1))
    assert a[:32] == b[:32] and a[32:] != b[32:40]
    assert not set(c) & set(a)
    longer = ids.prompt(TraceRequest(0.0, 60, 1, "sys", 48))  # extends the shared prefix
    assert longer[:32] == a[:32]
    assert ids.prompt(TraceRequest(0.0, 3, 1, token_ids=(5, 6, 7))) == [5, 6, 7]


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def test_jsonl_trace(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "trace.jsonl",
        [
            {"arrival_s": 0.5, "prompt_tokens": 100, "output_tokens": 20, "prefix_id": "a"},
            {"arrival_s": 0, "prompt_tokens": 60, "output_tokens": 5, "prefix_id": "a"},
            {"arrival_s": 1, "prompt_tokens": 30, "output_tokens": 5},
            {
                "arrival_s": 2,
                "prompt_tokens": 90,
                "output_tokens": 5,
                "prefix_id": "b",
                "prefix_tokens": 64,
            },
        ],
    )
    trace = make_trace(str(path))
    assert [r.arrival_s for r in trace.requests] == [0.0, 0.5, 1.0, 2.0]
    # Without prefix_tokens, the prefix is the group's shortest prompt.
    assert [r.prefix_tokens for r in trace.requests] == [60, 60, 0, 64]
    assert len(make_trace(str(path), num_requests=2).requests) == 2


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt_tokens": 1, "output_tokens": 1}, "arrival_s: missing"),
        ({"arrival_s": -1, "prompt_tokens": 1, "output_tokens": 1}, "arrival_s: must be"),
        ({"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 1}, "prompt_tokens: must be"),
        ({"arrival_s": 0, "prompt_tokens": 2, "output_tokens": 1.5}, "output_tokens: must be"),
        (
            {"arrival_s": 0, "prompt_tokens": 2, "output_tokens": 1, "prompt": "x"},
            "prompt: unknown field",
        ),
        (
            {"arrival_s": 0, "prompt_tokens": 2, "output_tokens": 1, "prefix_tokens": 1},
            "prefix_tokens: needs a prefix_id",
        ),
        (
            {
                "arrival_s": 0,
                "prompt_tokens": 2,
                "output_tokens": 1,
                "prefix_id": "a",
                "prefix_tokens": 3,
            },
            "prefix_tokens: 3 exceeds",
        ),
        ([1, 2], "each line must be a JSON object"),
    ],
)
def test_bad_jsonl_names_line_and_field(tmp_path: Path, row: object, message: str) -> None:
    good = {"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}
    path = _write(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(ValueError, match=f"bad.jsonl:2: .*{message}"):
        make_trace(str(path))


def test_unknown_workload_and_bad_count() -> None:
    with pytest.raises(ValueError, match=r"^workload: 'nope' is neither"):
        make_trace("nope")
    with pytest.raises(ValueError, match=r"^num_requests: "):
        make_trace("lab", num_requests=0)
