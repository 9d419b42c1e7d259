"""Helpers for tests of the replicated data path: a 3-node cluster, etcd polling."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.status import ClusterStatus, read_status
from broky.replication.local_cluster import LocalNode, TopicSpec

TOPIC = TopicSpec()


@contextmanager
def local_nodes(
    etcd_url: str, cluster: str, directory: Path, count: int = 3, topic: TopicSpec = TOPIC
) -> Iterator[list[LocalNode]]:
    """``count`` started nodes, SIGKILLed (by PID) at the end whatever happened."""
    nodes = [
        LocalNode(etcd_url, cluster, f"n{i}", directory / f"n{i}", topic)
        for i in range(1, count + 1)
    ]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)


async def wait_status(
    client: EtcdClient, keys: ClusterKeys, check: Callable[[ClusterStatus], bool], bound: float
) -> ClusterStatus:
    """Poll etcd until ``check`` holds (TooSlowError after ``bound`` seconds)."""
    with trio.fail_after(bound):
        while True:
            status = await read_status(client, keys)
            if check(status):
                return status
            await trio.sleep(0.05)
