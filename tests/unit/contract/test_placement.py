"""A replica's placement as its engine process applies it: the environment torch reads."""

from __future__ import annotations

from infer.contract.placement import ReplicaPlacement


def test_the_environment_names_only_what_was_decided() -> None:
    assert ReplicaPlacement(0, 2, None, None, None).environment() == {}
    placement = ReplicaPlacement(1, 2, ("2", "3"), 8, 29501)
    assert placement.environment() == {"CUDA_VISIBLE_DEVICES": "2,3", "OMP_NUM_THREADS": "8"}
    assert placement.describe() == "replica 1 of 2"


def test_a_replica_given_no_gpu_hides_them_all() -> None:
    assert ReplicaPlacement(0, 1, (), None, None).environment() == {"CUDA_VISIBLE_DEVICES": ""}
