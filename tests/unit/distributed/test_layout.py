"""A process's ranks over nodes: one process per node (each starts its local ranks), or one
per rank from torchrun's environment; where the ranks meet."""

from __future__ import annotations

import pytest

from infer.config import EngineConfig
from infer.distributed.layout import (
    DEFAULT_MASTER_PORT,
    Rendezvous,
    node_ranks,
    rendezvous_for,
)

TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)


def torchrun(monkeypatch: pytest.MonkeyPatch, rank: int, local_rank: int, world: int) -> None:
    env = {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": 2,
           "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": 29400}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))


def test_each_node_runs_its_share_first_in_its_own_process_then_its_workers() -> None:
    config = EngineConfig(device="cpu", tensor_parallel_size=6, nnodes=3, node_rank=1)
    ranks = node_ranks(config)
    assert (ranks.rank, ranks.local_rank, ranks.spawned) == (2, 0, (3,))
    assert ranks.local_rank_of(3) == 1  # its GPU: cuda:1
    assert not ranks.runs_engine
    assert ranks.describe() == "ranks 2-3 of 6"


def test_node_0_runs_the_engine_as_rank_0() -> None:
    ranks = node_ranks(EngineConfig(device="cpu", tensor_parallel_size=4, nnodes=2))
    assert ranks.runs_engine and ranks.spawned == (1,)


def test_under_torchrun_each_process_is_its_rank_and_starts_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torchrun(monkeypatch, rank=3, local_rank=1, world=4)
    config = EngineConfig(device="cpu", tensor_parallel_size=4, nnodes=2, node_rank=1)
    ranks = node_ranks(config)
    assert (ranks.rank, ranks.local_rank, ranks.spawned, ranks.launched) == (3, 1, (), True)
    rendezvous = rendezvous_for(config)
    assert rendezvous.endpoint == "10.0.0.7:29400"


def test_torchrun_world_other_than_tensor_parallel_size_names_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torchrun(monkeypatch, rank=0, local_rank=0, world=2)
    with pytest.raises(ValueError, match=r"^tensor_parallel_size: .*WORLD_SIZE=2"):
        node_ranks(EngineConfig(device="cpu", tensor_parallel_size=4))


def test_the_rendezvous_port_one_node_free_several_nodes_torchruns_default() -> None:
    one = rendezvous_for(EngineConfig(device="cpu", tensor_parallel_size=2))
    several = rendezvous_for(EngineConfig(device="cpu", tensor_parallel_size=2, nnodes=2))
    given = EngineConfig(device="cpu", tensor_parallel_size=2, nnodes=2, master_port=1234)
    assert one.port != DEFAULT_MASTER_PORT
    assert several.port == DEFAULT_MASTER_PORT
    assert rendezvous_for(given).port == 1234


def test_a_rendezvous_travels_to_a_worker_through_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendezvous = Rendezvous("fd00::1", 4321, timeout_s=7.5, ranks_per_node=2)
    for name, value in rendezvous.env().items():
        monkeypatch.setenv(name, value)
    assert Rendezvous.from_env() == rendezvous
    assert rendezvous.endpoint == "[fd00::1]:4321"
