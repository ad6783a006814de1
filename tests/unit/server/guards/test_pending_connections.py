"""The bounds on pending connections, as bookkeeping: which connection goes when one more
would pass a bound (the longest idle, else the longest incomplete; one client's bound
touches only that client's), and nothing younger than the grace period goes."""

from __future__ import annotations

from infer.server.guards.pending_connections import PendingConnections


def test_over_the_bound_the_longest_idle_goes_first_then_the_longest_incomplete() -> None:
    pending: PendingConnections[str] = PendingConnections(limit=3, per_client=10, grace_s=0.0)
    assert pending.add("opened", "a", idle=False, now=1.0) == []
    assert pending.add("idle", "b", idle=True, now=2.0) == []
    assert pending.add("idle later", "c", idle=True, now=3.0) == []
    assert pending.add("new", "d", idle=False, now=4.0) == ["idle"]
    assert pending.add("newer", "d", idle=False, now=5.0) == ["idle later"]
    assert pending.add("newest", "d", idle=False, now=6.0) == ["opened"]
    assert len(pending) == 3


def test_one_clients_bound_closes_only_that_clients_connections() -> None:
    pending: PendingConnections[str] = PendingConnections(limit=100, per_client=2, grace_s=0.0)
    pending.add("other", "10.0.0.2", idle=True, now=0.5)
    pending.add("first", "10.0.0.1", idle=False, now=1.0)
    pending.add("second", "10.0.0.1", idle=False, now=2.0)
    assert pending.add("third", "10.0.0.1", idle=False, now=3.0) == ["first"]
    assert pending.add("another", "10.0.0.2", idle=False, now=4.0) == []  # its second
    assert len(pending) == 4


def test_a_connection_pending_for_less_than_the_grace_period_stays() -> None:
    pending: PendingConnections[int] = PendingConnections(limit=2, per_client=2, grace_s=1.0)
    for conn in range(5):  # a burst: all within the grace period
        assert pending.add(conn, "a", idle=False, now=10.0 + conn * 0.1) == []
    assert len(pending) == 5
    # A second on, the burst's first ones have had their time: the bounds apply again.
    assert pending.add(5, "a", idle=False, now=11.05) == [0]
    assert pending.add(6, "a", idle=False, now=11.5) == [1, 2, 3, 4]


def test_a_connection_that_is_no_longer_pending_is_forgotten() -> None:
    pending: PendingConnections[str] = PendingConnections(limit=1, per_client=1, grace_s=0.0)
    pending.add("busy now", "a", idle=False, now=1.0)
    pending.remove("busy now")  # its request is whole
    pending.remove("busy now")  # then it closed: nothing to do
    assert pending.add("next", "a", idle=False, now=2.0) == []
    assert pending.add("next", "a", idle=True, now=3.0) == []  # pending again: counted once
    assert len(pending) == 1
