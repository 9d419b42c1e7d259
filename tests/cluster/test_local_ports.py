"""Ports of the local test clusters: never handed out twice in a process.

All of a cluster's nodes get their ports before the first one starts; a
port handed out twice (the kernel reuses a released one) made a follower
dial another node's client listener instead of its replication port."""

from __future__ import annotations

from broky.replication.local_cluster import _free_ports, free_port


def test_ports_are_never_handed_out_twice() -> None:
    given = [free_port() for _ in range(1000)]  # the kernel alone repeats some
    for _ in range(100):
        first = _free_ports(2)
        given += [first, first + 1]
    assert len(given) == len(set(given))
