"""The serving client against a fake SSE server: bodies, arrivals, client-side timings."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from infer.bench.http_client import run_serving
from infer.bench.metrics import summarize
from infer.workloads import RequestSpec, Workload

from .conftest import FakeServer

pytestmark = pytest.mark.serial  # arrivals and token gaps timed to tens of milliseconds


def _workload(sequential: bool = False) -> Workload:
    return Workload(
        "test",
        "",
        [
            RequestSpec([11, 12, 13], 4, 0.0),
            RequestSpec([21, 22], 3, 0.3),
            RequestSpec([31], 2, 0.1),
        ],
        sequential=sequential,
    )


def test_streams_token_ids_with_the_workload_arrivals(fake_server: FakeServer) -> None:
    model, result = asyncio.run(run_serving(fake_server.url, _workload(), progress=False))
    assert model == "fake-model"  # from /v1/models
    bodies = sorted((b for _, b in fake_server.received), key=lambda b: b["prompt"])
    assert [b["prompt"] for b in bodies] == [[11, 12, 13], [21, 22], [31]]
    for body in bodies:
        assert body["stream"] is True and body["ignore_eos"] is True
        assert body["model"] == "fake-model" and body["temperature"] == 0.0
        assert body["stream_options"] == {"include_usage": True}
    assert {b["max_tokens"] for b in bodies} == {4, 3, 2}
    sent = sorted(t for t, _ in fake_server.received)
    assert sent[1] - sent[0] == pytest.approx(0.1, abs=0.05)
    assert sent[2] - sent[0] == pytest.approx(0.3, abs=0.05)

    assert [r.output_tokens for r in result.requests] == [4, 3, 2]
    assert [r.arrival_s for r in result.requests] == pytest.approx([0.0, 0.3, 0.1], abs=0.05)
    for request in result.requests:
        assert request.ok and request.ttft_s >= 0.02
        assert all(0.015 <= gap < 0.2 for gap in request.itl_s)
    summary = summarize(result)
    assert summary["output_tokens"] == 9 and summary["num_failed"] == 0
    assert summary["itl_ms"]["p50"] == pytest.approx(20.0, abs=10.0)


def test_every_request_asks_for_the_temperature_given(fake_server: FakeServer) -> None:
    asyncio.run(run_serving(fake_server.url, _workload(), progress=False, temperature=1.0))
    asyncio.run(
        run_serving(fake_server.url, _workload(sequential=True), progress=False, temperature=0.7)
    )
    assert [b["temperature"] for _, b in fake_server.received] == [1.0] * 3 + [0.7] * 3


def test_sequential_waits_for_each_answer(fake_server: FakeServer) -> None:
    _, result = asyncio.run(
        run_serving(fake_server.url, _workload(sequential=True), model="fake-model", progress=False)
    )
    requests = result.requests
    for before, after in itertools.pairwise(requests):
        assert after.arrival_s >= before.finish_s
    assert [b["prompt"] for _, b in fake_server.received] == [[11, 12, 13], [21, 22], [31]]


def test_chunks_of_several_tokens(fake_server: FakeServer) -> None:
    fake_server.tokens_per_chunk = 3
    workload = Workload("test", "", [RequestSpec([5], 7)])
    _, counted = asyncio.run(run_serving(fake_server.url, workload, progress=False))
    assert counted.requests[0].output_tokens == 7  # the usage count fills in the gap
    fake_server.send_token_ids = True
    _, exact = asyncio.run(run_serving(fake_server.url, workload, progress=False))
    times = exact.requests[0].token_times_s
    assert len(times) == 7 and times == sorted(times)


def test_server_that_streams_no_text_still_counts_every_token(fake_server: FakeServer) -> None:
    fake_server.text_only_at_end = True  # e.g. a model without a tokenizer
    workload = Workload("test", "", [RequestSpec([5], 5)])
    _, result = asyncio.run(run_serving(fake_server.url, workload, progress=False))
    request = result.requests[0]
    assert request.ok and request.output_tokens == 5
    assert request.ttft_s == request.e2e_s >= 5 * 0.02  # all seen at the end


def test_http_errors_are_recorded_per_request(fake_server: FakeServer) -> None:
    fake_server.status = 400
    _, result = asyncio.run(run_serving(fake_server.url, _workload(), progress=False))
    assert all(not r.ok for r in result.requests)
    assert all(
        "HTTP 400" in (r.error or "") and "max_tokens" in (r.error or "") for r in result.requests
    )
    assert summarize(result)["num_failed"] == 3


def test_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"url: .* did not answer"):
        asyncio.run(run_serving("http://127.0.0.1:9", _workload(), progress=False))


def test_client_processes_share_the_workload_and_its_schedule(fake_server) -> None:  # type: ignore[no-untyped-def]
    workload = _workload()
    _, one = asyncio.run(run_serving(fake_server.url, workload, progress=False))
    _, three = asyncio.run(run_serving(fake_server.url, workload, progress=False, processes=3))
    assert len(three.requests) == len(one.requests) == len(workload.requests)
    for single, spread, spec in zip(one.requests, three.requests, workload.requests):
        assert spread.ok and spread.prompt_tokens == single.prompt_tokens
        assert spread.output_tokens == single.output_tokens == spec.max_tokens
        # Sent on schedule: no process was still starting (importing) when the clock began.
        assert spec.arrival_s <= spread.arrival_s < spec.arrival_s + 0.25
