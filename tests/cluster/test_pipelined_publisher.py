"""A pipelined ClusterPublisher whose batches in flight are refused part-way.

``min_insync_replicas = 3``: pausing a follower of the hot key's leader
shrinks the ISR after ``replica_lag_max`` (1 s), so the leader refuses new
rounds with NotEnoughReplicas and fails rounds it already stored; when the
follower runs again and catches up, later rounds are accepted, while
batches behind a refused one are still in flight (five publishing tasks on
one publisher, one hot key and a second key). The paused node also loses
the partitions it led, so batches are refused with NotLeader and retried on
the new leaders too. Afterwards every acked message is on every replica
exactly once, and each key's (each partition's) messages are in the order
their ``publish`` calls were made.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest
import trio

from broky.client.cluster import ClusterPublisher
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.status import read_status
from broky.replication.local_cluster import fully_in_sync, partition_vbuckets
from tests.cluster.history import Acked, check, payload
from tests.cluster.replicated import SETTLE, TOPIC, local_nodes, wait_status

HOT = "orders.hot"
OTHER = "orders.other"
#: Seconds the follower stays paused: past replica_lag_max (1 s) and the
#: lease TTL, so the ISR shrinks and its partitions fail over.
PAUSED = 2.5
BATCH = 3


@pytest.fixture
def cluster_name(prefix: bytes) -> str:
    return "p" + prefix.decode().strip("/").replace("/", "-")


async def test_batches_refused_mid_pipeline_are_stored_once_and_in_order(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    keys = ClusterKeys.for_cluster(cluster_name)
    acked: list[Acked] = []
    seqs = itertools.count(0, BATCH)
    stop = trio.Event()
    with (
        trio.fail_after(150),
        local_nodes(
            etcd_url, cluster_name, tmp_path, extra_config="min_insync_replicas = 3\n"
        ) as nodes,
    ):
        by_id = {node.node_id: node for node in nodes}
        await wait_status(etcd, keys, lambda s: fully_in_sync(s, TOPIC, 3), SETTLE)
        async with ClusterPublisher.open(
            [n.address for n in nodes], retry_for=SETTLE, max_in_flight=5
        ) as publisher:
            first = await publisher.publish(HOT, [payload(0, -1)])
            partition = first[0].partition

            async def publish() -> None:
                while not stop.is_set():
                    seq = next(seqs)
                    key = HOT if seq % (4 * BATCH) else OTHER
                    # Any error fails the test: retry_for outlasts the pause.
                    runs = await publisher.publish(key, [payload(0, seq + i) for i in range(BATCH)])
                    for run in runs:
                        offsets = range(run.first_offset, run.last_offset + 1)
                        acked.extend(
                            Acked(0, seq + index, run.partition, offset)
                            for index, offset in enumerate(offsets)
                        )

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(publish)
                await trio.sleep(1.0)
                status = await read_status(etcd, keys)
                state = status.vbuckets[partition_vbuckets(TOPIC)[partition]].state
                follower = next(node for node in state.replicas if node != state.leader)
                by_id[follower].send(signal.SIGSTOP)
                await trio.sleep(PAUSED)
                by_id[follower].send(signal.SIGCONT)
                await wait_status(etcd, keys, lambda s: fully_in_sync(s, TOPIC, 3), SETTLE)
                await trio.sleep(1.0)
                stop.set()
            retries = publisher.retries
        await trio.sleep(0.5)  # the last fetches carry the final high watermark
        for node in nodes:
            node.stop(signal.SIGTERM)
        replicas = {n.node_id: n.records(TOPIC.name) for n in nodes}
    verdict = check(acked, replicas, by_id)
    assert retries > 0, "no batch was refused: the pause did not shrink the ISR"
    assert verdict.ok, verdict
    assert verdict.duplicates == 0, verdict
    hot = sorted((a.seq, a.offset) for a in acked if a.partition == partition)
    assert [offset for _, offset in hot] == sorted(offset for _, offset in hot)
    assert len(acked) > 100
