"""The router in front of stand-in workers (``standin_worker.py``): where requests go, what
comes back, and what happens when workers fail, come or go."""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.unit.router.conftest import HEALTH_INTERVAL_S, running_router, standin_workers

from infer.routing import RoutingSettings

CLIENT = httpx.Client(timeout=30)  # one for all: a client costs milliseconds to make
SYSTEM = "You answer questions about the weather in great detail. " * 40


def _chat(system: str, question: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": "standin", "messages": messages, **extra}


def _worker_of(url: str, path: str, body: dict[str, Any]) -> str:
    answer = CLIENT.post(url + path, json=body)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-worker"]


def _within_a_fifth_of_even(counts: Counter[str], workers: int) -> bool:
    even = sum(counts.values()) / workers
    return len(counts) == workers and all(abs(n - even) <= 0.2 * even for n in counts.values())


def _wait_for(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _samples(router: str, name: str, **labels: str) -> dict[str, float]:
    """The router's metric ``name`` per worker, of the samples with ``labels``."""
    metrics = CLIENT.get(f"{router}/metrics").text
    return {
        sample.labels["worker"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    }


def _health_of(router: str) -> dict[str, bool]:
    workers = CLIENT.get(f"{router}/workers").json()["workers"]
    return {w["url"]: w["healthy"] for w in workers}


def test_requests_sharing_a_prefix_land_on_one_worker(three_workers: dict[str, str]) -> None:
    with running_router(list(three_workers.values())) as router:
        chat = {
            _worker_of(router, "/v1/chat/completions", _chat(SYSTEM, f"Day {i}?"))
            for i in range(12)
        }
        prompt = "A long shared document. " * 100
        completions = {
            _worker_of(router, "/v1/completions", {"model": "standin", "prompt": prompt + str(i)})
            for i in range(12)
        }
        assert len(chat) == 1 and len(completions) == 1
        by_prefix = _samples(router, "infer_router_requests_routed_total", reason="prefix")
        assert sum(by_prefix.values()) == 22  # all but the first of each


def test_a_mixed_workload_spreads_within_a_fifth_of_even(three_workers: dict[str, str]) -> None:
    """Six prefix groups of uneven sizes and distinct prompts, twelve clients at a time, each
    request taking a while: the load thresholds (scaled down to this concurrency) spill the
    hot groups to the other workers, which then share them by load."""
    rng = random.Random(0)
    groups = [f"Group {g}: " + "shared context " * 60 for g in range(6)]
    slow = {"max_tokens": 2, "standin_delay_s": 0.05}
    bodies = [_chat(groups[min(int(rng.expovariate(0.5)), 5)], f"q{i}", **slow) for i in range(80)]
    bodies += [_chat(f"Prompt {i} " * 80, "?", **slow) for i in range(40)]
    rng.shuffle(bodies)
    with (
        running_router(
            list(three_workers.values()),
            settings=RoutingSettings(balance_abs_threshold=2, balance_rel_threshold=1.2),
        ) as router,
        ThreadPoolExecutor(12) as pool,
    ):
        counts = Counter(pool.map(lambda b: _worker_of(router, "/v1/chat/completions", b), bodies))
        by_prefix = _samples(router, "infer_router_requests_routed_total", reason="prefix")
    assert _within_a_fifth_of_even(counts, 3), counts
    assert sum(by_prefix.values()) >= 50  # most of the groups' requests went by their prefix


def test_streams_and_errors_pass_through_byte_for_byte(three_workers: dict[str, str]) -> None:
    direct = three_workers["a"]
    cases = [
        ("/v1/chat/completions", _chat(SYSTEM, "Hi", stream=True, max_tokens=5)),
        ("/v1/completions", {"model": "standin", "prompt": "x", "stream": True}),
        ("/v1/responses", {"model": "standin", "input": "Hi", "stream": True}),
        ("/v1/completions", {"model": "standin", "prompt": "x"}),
        ("/v1/completions", {"model": "nope", "prompt": "x"}),  # the worker's 404
    ]
    with running_router(list(three_workers.values())) as router:
        for path, body in cases:
            want = CLIENT.post(direct + path, json=body)
            with CLIENT.stream("POST", router + path, json=body) as got:
                got_bytes = got.read()
                assert (got.status_code, got.headers.get("content-type")) == (
                    want.status_code,
                    want.headers.get("content-type"),
                )
            assert got_bytes == want.content, path
        malformed = CLIENT.post(f"{router}/v1/completions", content=b"{not json")
        assert malformed.status_code == 400
        assert malformed.json()["error"]["message"] == "request body: malformed JSON"
        models = CLIENT.get(f"{router}/v1/models")
        assert models.json()["data"][0]["id"] == "standin"


def test_streamed_events_reach_the_client_as_they_come(three_workers: dict[str, str]) -> None:
    a = three_workers["a"]
    body = {"model": "standin", "prompt": "x", "stream": True, "max_tokens": 10,
            "standin_delay_s": 0.2}  # fmt: skip
    with (
        running_router([a]) as router,
        CLIENT.stream("POST", f"{router}/v1/completions", json=body) as stream,
    ):
        chunks = stream.iter_raw()
        first = next(chunks)
        streaming = httpx.get(f"{a}/metrics").text  # the worker, while the client reads
        rest = b"".join(chunks)
    assert first.startswith(b"data: ") and first.count(b"\n\n") == 1  # one whole event
    assert "infer_num_requests_running 1" in streaming  # not the whole stream buffered
    assert rest.count(b"\n\n") == 10 and rest.endswith(b"data: [DONE]\n\n")


def test_a_client_that_leaves_frees_its_worker(three_workers: dict[str, str]) -> None:
    a = three_workers["a"]
    long = {"model": "standin", "prompt": "x", "max_tokens": 50, "standin_delay_s": 0.1}
    idle = lambda: httpx.get(f"{a}/metrics").text.count("infer_num_requests_running 0") == 1
    with running_router([a]) as router:
        with pytest.raises(httpx.ReadTimeout):
            CLIENT.post(f"{router}/v1/completions", json=long, timeout=0.5)
        _wait_for(idle, within=2)
        with CLIENT.stream("POST", f"{router}/v1/completions", json={**long, "stream": True}) as s:
            next(s.iter_raw())
        _wait_for(idle, within=2)
        assert _samples(router, "infer_router_requests_in_flight") == {a: 0}


def test_health_metrics_and_no_healthy_worker(three_workers: dict[str, str]) -> None:
    with running_router([three_workers["a"]]) as router:
        assert CLIENT.get(f"{router}/health").json() == {"status": "ok", "healthy_workers": 1}
        CLIENT.post(f"{router}/v1/completions", json={"model": "standin", "prompt": "x"})
        a = three_workers["a"]
        assert _samples(router, "infer_router_requests_routed_total", reason="load") == {a: 1}
        assert _samples(router, "infer_router_worker_healthy") == {a: 1}
        assert _samples(router, "infer_router_requests_in_flight") == {a: 0}
        assert _samples(router, "infer_router_worker_failures_total") == {a: 0}
        CLIENT.delete(f"{router}/workers", params={"url": a})
        assert CLIENT.get(f"{router}/health").status_code == 503
        answer = CLIENT.post(f"{router}/v1/completions", json={"model": "standin", "prompt": "x"})
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "unavailable"


def test_workers_are_added_and_removed_while_it_runs(three_workers: dict[str, str]) -> None:
    a, b = three_workers["a"], three_workers["b"]
    with running_router([a]) as router:
        added = CLIENT.post(f"{router}/workers", json={"url": b + "/"})
        assert added.status_code == 201 and added.json()["url"] == b
        assert added.json()["healthy"]
        bodies = [_chat(f"Prompt {i} " * 80, "?") for i in range(10)]
        assert Counter(_worker_of(router, "/v1/chat/completions", x) for x in bodies) == {
            "a": 5,
            "b": 5,
        }
        assert CLIENT.delete(f"{router}/workers", params={"url": a}).json() == {"removed": a}
        assert {_worker_of(router, "/v1/chat/completions", x) for x in bodies} == {"b"}
        assert [w["url"] for w in CLIENT.get(f"{router}/workers").json()["workers"]] == [b]
        again = CLIENT.post(f"{router}/workers", json={"url": b})
        assert (again.status_code, again.json()["error"]["param"]) == (400, "url")
        assert CLIENT.post(f"{router}/workers", json={"url": "nowhere"}).status_code == 400
        assert CLIENT.post(f"{router}/workers", json={"address": b}).status_code == 400
        gone = CLIENT.delete(f"{router}/workers", params={"url": a})
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
        assert CLIENT.delete(f"{router}/workers").status_code == 400


def test_the_api_key_guards_v1_and_workers_not_health(three_workers: dict[str, str]) -> None:
    with running_router([three_workers["a"]], api_key="secret") as router:
        body = {"model": "standin", "prompt": "x"}
        assert CLIENT.post(f"{router}/v1/completions", json=body).status_code == 401
        assert CLIENT.get(f"{router}/workers").status_code == 401
        assert CLIENT.get(f"{router}/health").status_code == 200
        key = {"Authorization": "Bearer secret"}
        assert CLIENT.post(f"{router}/v1/completions", json=body, headers=key).status_code == 200
        assert CLIENT.get(f"{router}/workers", headers=key).status_code == 200


def test_a_worker_failing_its_health_leaves_rotation_and_rejoins() -> None:
    with (
        standin_workers("a", "b") as workers,
        running_router([url for url, _ in workers.values()]) as router,
    ):
        b = workers["b"][0]
        CLIENT.post(f"{b}/standin/health", json={"ok": False})
        _wait_for(lambda: not _health_of(router)[b])
        bodies = [_chat(f"Prompt {i} " * 80, "?") for i in range(6)]
        assert {_worker_of(router, "/v1/chat/completions", x) for x in bodies} == {"a"}
        CLIENT.post(f"{b}/standin/health", json={"ok": True})
        _wait_for(lambda: _health_of(router)[b])
        more = [_chat(f"Other {i} " * 80, "?") for i in range(6)]
        assert {_worker_of(router, "/v1/chat/completions", x) for x in more} == {"a", "b"}


def test_a_killed_worker_fails_only_its_own_requests() -> None:
    slow = {"model": "standin", "max_tokens": 20, "standin_delay_s": 0.1}  # 2 s each
    with (
        standin_workers("a", "b") as workers,
        running_router([url for url, _ in workers.values()]) as router,
        ThreadPoolExecutor(8) as pool,
    ):
        streams = []
        for i in range(4):  # distinct prompts: two per worker, by load
            stream = CLIENT.stream(
                "POST",
                f"{router}/v1/completions",
                json={**slow, "prompt": f"s{i}" * 50, "stream": True},
            )
            response = stream.__enter__()
            streams.append((stream, response, response.iter_raw()))
        waiting = [
            pool.submit(
                CLIENT.post, f"{router}/v1/completions", json={**slow, "prompt": f"w{i}" * 50}
            )
            for i in range(4)
        ]
        in_flight = lambda: sum(_samples(router, "infer_router_requests_in_flight").values())
        _wait_for(lambda: in_flight() == 8)
        workers["b"][1].send_signal(signal.SIGKILL)
        ends = {}
        for stream, response, chunks in streams:
            ends.setdefault(response.headers["x-worker"], []).append(b"".join(chunks))
            stream.__exit__(None, None, None)
        assert len(ends["a"]) == len(ends["b"]) == 2
        assert all(end.endswith(b"data: [DONE]\n\n") and b"error" not in end for end in ends["a"])
        for end in ends["b"]:
            error, done = end.split(b"\n\n")[-3:-1]
            assert json.loads(error.removeprefix(b"data: "))["error"]["code"] == "unavailable"
            assert done == b"data: [DONE]"
        answers = [future.result() for future in waiting]
        assert sorted(a.status_code for a in answers) == [200, 200, 503, 503]
        assert {a.headers["x-worker"] for a in answers if a.status_code == 200} == {"a"}
        failed = next(a for a in answers if a.status_code == 503).json()["error"]
        assert failed["code"] == "unavailable" and workers["b"][0] in failed["message"]
        # new requests all reach the survivor, before and after a probe notices
        fresh = [_chat(f"Fresh {i} " * 80, "?") for i in range(6)]
        assert {_worker_of(router, "/v1/chat/completions", x) for x in fresh} == {"a"}
        assert not _health_of(router)[workers["b"][0]]
        assert CLIENT.get(f"{router}/health").status_code == 200
        time.sleep(2 * HEALTH_INTERVAL_S)
        assert {_worker_of(router, "/v1/chat/completions", x) for x in fresh} == {"a"}


@pytest.mark.parametrize("bad", [b"[" * 100_000, b"\xff\xfe", b"null"])
def test_bodies_the_router_cannot_read_still_reach_a_worker(
    three_workers: dict[str, str], bad: bytes
) -> None:
    with running_router([three_workers["a"]]) as router:
        answer = CLIENT.post(f"{router}/v1/chat/completions", content=bad)
        assert answer.status_code == 400 and answer.headers["content-type"] == "application/json"
