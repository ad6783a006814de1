import httpx
import pytest

from infer.router.workers import WorkerPool, worker_url
from infer.routing import RoutingSettings


def test_worker_urls_are_normalised() -> None:
    assert worker_url(" http://10.0.0.2:8000/ ") == "http://10.0.0.2:8000"
    assert worker_url("https://host/prefix") == "https://host/prefix"


@pytest.mark.parametrize("url", ["", "10.0.0.2:8000", "ftp://host", "http://", "http://h?q=1"])
def test_a_bad_worker_url_names_the_field(url: str) -> None:
    with pytest.raises(ValueError, match=r"^url: "):
        worker_url(url)


def test_workers_are_added_once_and_removed_once() -> None:
    pool = WorkerPool(["http://a:1"], httpx.AsyncClient(), RoutingSettings())
    assert pool.add("http://b:1/") == "http://b:1"
    with pytest.raises(ValueError, match="already"):
        pool.add("http://b:1")
    assert pool.urls == ["http://a:1", "http://b:1"]
    assert [r.healthy for r in pool.reports()] == [False, False]  # until probed
    pool.remove("http://a:1")
    with pytest.raises(LookupError, match="not a worker"):
        pool.remove("http://a:1")
    assert pool.urls == ["http://b:1"]


def test_an_unreachable_worker_leaves_rotation_and_its_failures_count() -> None:
    pool = WorkerPool([], httpx.AsyncClient(), RoutingSettings())
    pool.add("http://a:1", healthy=True)
    pool.failed("http://a:1", unreachable=False)
    assert [(r.healthy, r.failures) for r in pool.reports()] == [(True, 1)]
    pool.failed("http://a:1", unreachable=True)
    assert [(r.healthy, r.failures) for r in pool.reports()] == [(False, 2)]


@pytest.mark.parametrize("name", ["health_interval", "health_timeout"])
def test_bad_intervals_name_their_field(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        WorkerPool([], httpx.AsyncClient(), RoutingSettings(), **{name: 0.0})
