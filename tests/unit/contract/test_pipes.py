"""The pipes between API processes and engine processes: every API process reaches every
replica over a pair of its own, and only the first holds the engines' ends."""

from __future__ import annotations

from infer.contract.pipes import replica_links


def test_every_api_process_has_its_own_pipes_to_every_replica() -> None:
    links = replica_links(replicas=2, api_processes=3)
    assert [len(row) for row in links] == [2, 2, 2]
    for replica in range(2):
        engine = links[0][replica].engine
        assert engine is not None and len(engine) == 3  # one pair per API process
        assert all(links[process][replica].engine is None for process in (1, 2))
    ends = {id(link.api.commands) for row in links for link in row}
    assert len(ends) == 6
    # What API process 1 sends replica 1 arrives at that replica's second pair.
    links[1][1].api.commands.send("hello")
    engine_ends = links[0][1].engine
    assert engine_ends is not None
    assert engine_ends[1].commands.recv() == "hello"
