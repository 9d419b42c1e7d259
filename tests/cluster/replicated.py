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
from tests.cluster.netns import Network

TOPIC = TopicSpec()


@contextmanager
def local_nodes(
    etcd_url: str,
    cluster: str,
    directory: Path,
    count: int = 3,
    network: Network | None = None,
    workers: int = 1,
    topic: TopicSpec = TOPIC,
    extra_config: str = "",
) -> Iterator[list[LocalNode]]:
    """``count`` started nodes, SIGKILLed (by PID) at the end whatever
    happened; with a ``network``, each in a namespace of its own on it
    (hosts ``n1``, ``n2``... at ``.11``, ``.12``...). ``extra_config``: as
    LocalNode takes it, for every node."""
    nodes = []
    for i in range(1, count + 1):
        name = f"n{i}"
        host, wrapper = "127.0.0.1", tuple[str, ...]()
        if network is not None:
            added = network.add(name, 10 + i)
            host, wrapper = added.address, added.wrapper
        nodes.append(
            LocalNode(
                etcd_url,
                cluster,
                name,
                directory / name,
                topic,
                host=host,
                wrapper=wrapper,
                workers=workers,
                extra_config=extra_config,
            )
        )
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
