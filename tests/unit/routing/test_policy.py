import random
from collections import Counter

import pytest

from infer.routing.policy import CacheAwarePolicy, NoWorkerError, RoutingSettings

WORKERS = ("a", "b", "c")


def _policy(settings: RoutingSettings | None = None, workers: tuple[str, ...] = WORKERS):
    policy = CacheAwarePolicy(settings or RoutingSettings())
    for name in workers:
        policy.add_worker(name)
    return policy


def _text(seed: int, length: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij ") for _ in range(length))


def _within_a_fifth_of_even(counts: Counter[str], workers: tuple[str, ...]) -> bool:
    even = sum(counts.values()) / len(workers)
    return all(abs(counts[w] - even) <= 0.2 * even for w in workers)


def test_requests_sharing_a_prefix_stick_to_one_worker() -> None:
    policy = _policy()
    system = _text(0, 1000)
    chosen = set()
    for i in range(30):
        route = policy.choose(system + _text(100 + i, 200))
        chosen.add(route.worker)
        assert route.by_prefix == (i > 0)
        policy.finish(route.worker)
    assert len(chosen) == 1


def test_token_prompts_stick_by_blocks_of_tokens() -> None:
    policy = _policy()
    shared = list(range(1000, 1064))  # four blocks
    first = policy.choose([*shared, 1, 2, 3])
    policy.finish(first.worker)
    second = policy.choose([*shared, *range(7, 23)])
    assert (second.worker, second.cached_blocks, second.prompt_blocks) == (first.worker, 4, 5)


def test_distinct_prompts_spread_within_a_fifth_of_even() -> None:
    policy = _policy()
    sequential = Counter()
    for i in range(60):
        route = policy.choose(_text(i, 500))
        sequential[route.worker] += 1
        policy.finish(route.worker)
    assert _within_a_fifth_of_even(sequential, WORKERS), sequential
    concurrent = Counter(policy.choose(_text(1000 + i, 500)).worker for i in range(60))
    assert _within_a_fifth_of_even(concurrent, WORKERS), concurrent


def test_a_mixed_workload_spreads_within_a_fifth_of_even_and_groups_keep_their_worker() -> None:
    """Twelve prefix groups and distinct prompts, interleaved, some requests in flight."""
    policy = _policy()
    rng = random.Random(7)
    groups = [_text(500 + g, 800) for g in range(12)]
    counts: Counter[str] = Counter()
    worker_of_group: dict[int, set[str]] = {}
    in_flight: list[str] = []
    for i in range(240):
        if i % 4 == 3:
            route = policy.choose(_text(10_000 + i, 600))
        else:
            group = rng.randrange(len(groups))
            route = policy.choose(groups[group] + _text(20_000 + i, 100))
            worker_of_group.setdefault(group, set()).add(route.worker)
        counts[route.worker] += 1
        in_flight.append(route.worker)
        if len(in_flight) > 4:
            policy.finish(in_flight.pop(0))
    assert _within_a_fifth_of_even(counts, WORKERS), counts
    assert sum(len(w) for w in worker_of_group.values()) <= len(groups) + 2, worker_of_group


def test_a_hot_worker_sheds_load_to_the_least_loaded() -> None:
    settings = RoutingSettings(balance_abs_threshold=4, balance_rel_threshold=1.5)
    policy = _policy(settings, workers=("a", "b"))
    system = _text(0, 1000)
    routes = [policy.choose(system + _text(i, 100)) for i in range(40)]  # none finishes
    counts = Counter(r.worker for r in routes)
    assert max(counts.values()) - min(counts.values()) <= settings.balance_abs_threshold + 1
    spilled = next(r for r in routes if not r.by_prefix and r is not routes[0])
    assert spilled.worker != routes[0].worker
    # the worker it spilled to now holds the prefix too
    assert {s.name: s.cached_blocks > 0 for s in policy.workers()} == {"a": True, "b": True}


def test_without_the_load_check_a_hot_prefix_piles_on_one_worker() -> None:
    settings = RoutingSettings(balance_abs_threshold=10_000)
    policy = _policy(settings, workers=("a", "b"))
    system = _text(0, 1000)
    counts = Counter(policy.choose(system + _text(i, 100)).worker for i in range(40))
    assert len(counts) == 1


def test_a_worker_running_others_requests_counts_as_loaded() -> None:
    policy = _policy(RoutingSettings(balance_abs_threshold=2), workers=("a", "b"))
    system = _text(0, 1000)
    first = policy.choose(system)
    policy.finish(first.worker)
    policy.report_load(first.worker, other_requests=10)
    assert policy.choose(system + "more").worker != first.worker


def test_a_worker_with_a_full_kv_cache_is_avoided_unless_all_are_full() -> None:
    policy = _policy(workers=("a", "b"))
    system = _text(0, 1000)
    first = policy.choose(system)
    policy.finish(first.worker)
    other = "b" if first.worker == "a" else "a"
    policy.report_load(first.worker, kv_usage=0.99)
    policy.report_load(other, kv_usage=0.2)
    route = policy.choose(system)
    assert (route.worker, route.by_prefix) == (other, False)
    policy.finish(route.worker)
    policy.report_load(other, kv_usage=0.99)
    # both full: affinity again (both hold the prefix now; the less loaded one wins)
    assert policy.choose(system).by_prefix


def test_unhealthy_workers_leave_rotation_and_rejoin_with_an_empty_view() -> None:
    policy = _policy(workers=("a", "b"))
    system = _text(0, 1000)
    first = policy.choose(system)
    policy.finish(first.worker)
    assert policy.set_healthy(first.worker, False)
    assert not policy.set_healthy(first.worker, False)
    other = policy.choose(system)
    assert other.worker != first.worker
    policy.finish(other.worker)
    assert policy.set_healthy(first.worker, True)
    cached = {s.name: s.cached_blocks for s in policy.workers()}
    assert cached[first.worker] == 0 and cached[other.worker] > 0
    policy.set_healthy("a", False)
    policy.set_healthy("b", False)
    with pytest.raises(NoWorkerError):
        policy.choose(system)


def test_workers_come_and_go() -> None:
    policy = _policy(workers=("a",))
    with pytest.raises(ValueError, match="already known"):
        policy.add_worker("a")
    policy.add_worker("b")
    route = policy.choose("")
    policy.remove_worker(route.worker)
    policy.finish(route.worker)  # a request that outlived its worker's removal
    assert [s.name for s in policy.workers()] == ["b" if route.worker == "a" else "a"]
    with pytest.raises(ValueError, match="not known"):
        policy.remove_worker(route.worker)
    assert CacheAwarePolicy().workers() == []
    with pytest.raises(NoWorkerError):
        CacheAwarePolicy().choose("x")


def test_in_flight_counts_follow_choose_and_finish() -> None:
    policy = _policy(workers=("a",))
    policy.choose("x")
    policy.choose("y")
    policy.finish("a")
    (state,) = policy.workers()
    assert (state.in_flight, state.routed) == (1, 2)
    policy.finish("a")
    policy.finish("a")  # never below zero
    assert policy.workers()[0].in_flight == 0


def test_the_prefix_view_stays_within_its_memory_bound() -> None:
    settings = RoutingSettings(blocks_per_worker=50)
    policy = _policy(settings)
    for i in range(600):
        route = policy.choose(_text(i, 64 * 7))
        policy.finish(route.worker)
    assert all(0 < s.cached_blocks <= 50 for s in policy.workers())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cache_threshold", 1.5),
        ("balance_abs_threshold", -1),
        ("balance_rel_threshold", 0.5),
        ("kv_high_water", 0.0),
        ("tokens_per_block", 0),
        ("blocks_per_worker", 0),
    ],
)
def test_bad_settings_name_their_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        RoutingSettings(**{field: value})


def test_a_worker_that_joins_late_takes_its_turn_not_all_the_requests() -> None:
    policy = _policy(workers=("a", "b"))
    for i in range(20):
        policy.finish(policy.choose(_text(i, 500)).worker)
    policy.add_worker("c")
    later: Counter[str] = Counter()
    for i in range(30):
        route = policy.choose(_text(100 + i, 500))
        later[route.worker] += 1
        policy.finish(route.worker)
    assert later == {"a": 10, "b": 10, "c": 10}
