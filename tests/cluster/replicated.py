"""Helpers for tests of the replicated data path: a 3-node cluster, etcd polling."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from broky.client.cluster import ClusterPublisher
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.status import ClusterStatus, read_status
from broky.replication.local_cluster import LocalNode, TopicSpec, leaders
from tests.cluster.netns import Network

TOPIC = TopicSpec()
#: Bound for a cluster to settle (join, place, elect, catch up) or fail over
#: on a loaded CI box.
SETTLE = 30.0


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
    except BaseException:
        print_node_logs(nodes)
        raise
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)


#: Log lines worth showing when a cluster test fails: roles, ISR changes,
#: leases, warnings and errors (the rest is routine).
_TELLING = ("ISR", "leading", "lease", "joined", "truncated", "WARNING", "ERROR", "Traceback")


def print_node_logs(nodes: list[LocalNode], lines: int = 40) -> None:
    """The last telling lines of each node's logs, printed (pytest shows
    them with the failure): a fault that CI hits once in many runs must be
    diagnosable from that one run."""
    for node in nodes:
        telling = [
            line
            for path in sorted(node.directory.glob("node.*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if any(word in line for word in _TELLING) and "(no partitions)" not in line
        ]
        print(f"--- {node.node_id} ({node.address}): last {lines} telling log lines")
        print("\n".join(telling[-lines:]))


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


async def leader_node(
    client: EtcdClient, keys: ClusterKeys, nodes: list[LocalNode], topic: TopicSpec
) -> LocalNode:
    """The node leading partition 0 of ``topic`` now (AssertionError if none does)."""
    leader = leaders(await read_status(client, keys), topic)[0]
    assert leader is not None, f"{topic.name}/0 has no leader"
    return next(node for node in nodes if node.node_id == leader)


async def publish_numbered(
    seeds: list[str],
    key: str,
    messages: int,
    batch: int,
    pause: float,
    published: dict[int, bytes],
) -> None:
    """Publish ``m0`` ... ``m<messages - 1>`` on ``key`` with acks, ``batch``
    at a time and ``pause`` s apart, through one ClusterPublisher (it follows
    failovers), recording each acked offset's payload in ``published``."""
    async with ClusterPublisher.open(seeds, retry_for=SETTLE) as publisher:
        for start in range(0, messages, batch):
            payloads = [b"m%d" % i for i in range(start, start + batch)]
            runs = await publisher.publish(key, payloads)
            offsets = [o for r in runs for o in range(r.first_offset, r.last_offset + 1)]
            published.update(zip(offsets, payloads, strict=True))
            await trio.sleep(pause)
