"""Where each data-parallel replica runs: its own GPUs of those visible, its share of the
cores, its own rendezvous port; impossible layouts refused, naming the setting."""

from __future__ import annotations

import socket

import pytest

from infer import EngineConfig
from infer.server.bridge.placement import check_layout, place_replicas, visible_gpus


@pytest.fixture(autouse=True)
def cuda_settings_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Placement decides on settings alone: a CUDA config is built on a machine without."""
    monkeypatch.setattr("infer.config._cuda_available", lambda: True)


def config(**overrides: object) -> EngineConfig:
    return EngineConfig(model="smollm2-135m", **overrides)  # type: ignore[arg-type]


def test_one_replica_runs_as_a_single_engine_always_did() -> None:
    assert place_replicas(1, config(device="cuda"), environ={}) is None


def test_each_replica_takes_the_next_tensor_parallel_group_of_the_visible_gpus() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "4, 5,6,7", "OMP_NUM_THREADS": "2"}
    placements = place_replicas(2, config(device="cuda", tensor_parallel_size=2), environ)
    assert placements is not None
    assert [p.gpus for p in placements] == [("4", "5"), ("6", "7")]
    assert [p.cpu_threads for p in placements] == [None, None]  # OMP_NUM_THREADS decided
    ports = [p.master_port for p in placements]
    assert None not in ports and len(set(ports)) == 2
    assert placements[1].environment() == {"CUDA_VISIBLE_DEVICES": "6,7"}


def test_without_cuda_visible_devices_the_machines_gpus_are_counted_from_zero() -> None:
    placements = place_replicas(3, config(device="cuda"), environ={}, cores=12)
    assert placements is not None
    assert [p.gpus for p in placements] == [("0",), ("1",), ("2",)]
    assert [p.master_port for p in placements] == [None] * 3  # one rank: no group
    assert [p.cpu_threads for p in placements] == [4] * 3


def test_cpu_replicas_share_the_cores_and_see_no_gpu_setting() -> None:
    placements = place_replicas(2, config(device="cpu"), environ={}, cores=5)
    assert placements is not None
    assert [p.gpus for p in placements] == [None, None]
    assert placements[0].environment() == {"OMP_NUM_THREADS": "2"}
    assert placements[1].describe() == "replica 1 of 2"


def test_a_given_master_port_is_the_first_replicas_and_the_next_ones_follow() -> None:
    settings = config(device="cpu", tensor_parallel_size=2, master_port=29600)
    placements = place_replicas(3, settings, environ={}, cores=6)
    assert placements is not None
    assert [p.master_port for p in placements] == [29600, 29601, 29602]
    with pytest.raises(ValueError, match=r"^master_port: "):
        place_replicas(2, config(device="cpu", tensor_parallel_size=2, master_port=65535), {})


def test_free_group_ports_are_all_different() -> None:
    placements = place_replicas(4, config(device="cpu", tensor_parallel_size=2), {}, cores=8)
    assert placements is not None
    ports = {p.master_port for p in placements}
    assert len(ports) == 4
    for port in ports:  # free when handed out
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("replicas", "overrides", "environ", "message"),
    [
        (0, {}, {}, "^data_parallel_size: must be >= 1, got 0"),
        (2, {"device": "cuda:1"}, {}, "^device: each replica takes its own GPUs"),
        (
            2,
            {"device": "cuda", "tensor_parallel_size": 2},
            {"CUDA_VISIBLE_DEVICES": "0,1,2"},
            "^data_parallel_size: 2 replicas of tensor_parallel_size 2 need 4 GPUs, but "
            "CUDA_VISIBLE_DEVICES names 3",
        ),
        (2, {"tensor_parallel_size": 2, "nnodes": 2}, {}, "^data_parallel_size: replicas "
         "share one host"),
    ],
)  # fmt: skip
def test_impossible_layouts_name_the_setting(
    replicas: int, overrides: dict[str, object], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_layout(replicas, config(**overrides), environ)


def test_one_replica_may_take_any_device() -> None:
    check_layout(1, config(device="cuda:1"), {})


def test_visible_gpus_reads_cuda_visible_devices() -> None:
    assert visible_gpus({}) is None
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a1, 3"}) == ["GPU-a1", "3"]
