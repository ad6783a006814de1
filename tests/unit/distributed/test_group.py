"""Joining the group across nodes: a node that cannot reach the master, a node started with
other flags, two nodes given the same rank, and rank 0 waiting in vain are each a clear
error naming the flag (and the master's address), not a hang."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from infer.distributed.group import RendezvousTimeout, join_group
from infer.distributed.layout import Rendezvous

LAYOUT = {"tensor_parallel_size": "2", "nnodes": "2", "model": "m"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_node_that_cannot_reach_the_master_names_it_within_the_timeout() -> None:
    port = free_port()
    started = time.monotonic()
    endpoint = rf"127\.0\.0\.1:{port}"
    with pytest.raises(RendezvousTimeout, match=rf"^dist_timeout: .* {endpoint} within 1 s"):
        join_group(1, 2, Rendezvous("127.0.0.1", port, timeout_s=1.0), layout=LAYOUT)
    assert time.monotonic() - started < 30


def test_a_node_with_other_flags_is_refused_and_rank_0_names_the_missing_node() -> None:
    rendezvous = Rendezvous("127.0.0.1", free_port(), timeout_s=2.0, ranks_per_node=1)
    errors: list[Exception] = []

    def rank_0() -> None:
        try:
            join_group(0, 2, rendezvous, layout=LAYOUT)
        except Exception as exc:
            errors.append(exc)

    master = threading.Thread(target=rank_0)
    master.start()
    try:
        with pytest.raises(ValueError, match=r"^nnodes: node 0 runs with 2, this node with 3"):
            join_group(1, 2, rendezvous, layout={**LAYOUT, "nnodes": "3"})
    finally:
        master.join()
    assert len(errors) == 1 and isinstance(errors[0], RendezvousTimeout)
    assert "rank 1 (node 1) did not join the master at 127.0.0.1" in str(errors[0])
    assert not dist.is_initialized()


def test_two_nodes_with_the_same_rank_name_the_flag() -> None:
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))  # fmt: skip
    store.set("infer-layout", '{"nnodes": "2"}')
    store.add("infer-rank-1", 1)  # a node that joined as rank 1 already
    with pytest.raises(ValueError, match=r"^node_rank: rank 1 has already joined"):
        join_group(1, 2, Rendezvous("127.0.0.1", port, timeout_s=5.0), layout={"nnodes": "2"})
