"""A batch the deposed leader stored and replicated, retried on the new leader.

The leader of a partition is SIGKILLed while a batch is stored on it and on
one follower but not acked (the other follower is SIGSTOPped, so the high
watermark cannot pass it). That follower becomes the leader with the batch
in its log; the client, which never got the ack, retries the batch there.
As one idempotent producer across nodes (``ClusterPublisher``), the retry
is answered with the original offsets: stored once, nothing lost. With
idempotence off the same scenario stores the batch at least twice, which
shows the check would catch a regression.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
import trio

from broky.client.cluster import ClusterPublisher
from broky.client.durable import AckedRun
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.status import read_status
from broky.protocol.message import decode_message
from broky.replication import epochfile
from broky.replication.local_cluster import fully_in_sync, leaders, partition_vbuckets
from tests.cluster.history import Acked, check, payload
from tests.cluster.replicated import TOPIC, local_nodes, wait_status

#: Bound for the cluster to settle or fail over on a loaded CI box.
SETTLE = 30.0
#: Seconds between sending the batch and the SIGKILL: the follower fetches
#: it within milliseconds; the paused follower holds the ack back until the
#: leader drops it from the ISR, after replica_lag_max (1 s).
REPLICATED = 0.3
KEY = "orders.retry"


@pytest.fixture
def cluster_name(prefix: bytes) -> str:
    return "i" + prefix.decode().strip("/").replace("/", "-")


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "dedup-off"])
async def test_a_retry_of_a_replicated_unacked_batch_is_stored_once(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path, idempotent: bool
) -> None:
    keys = ClusterKeys.for_cluster(cluster_name)
    acked: list[Acked] = []

    def record(seq: int, runs: list[AckedRun]) -> None:
        for run in runs:
            for index, offset in enumerate(range(run.first_offset, run.last_offset + 1)):
                acked.append(Acked(0, seq + index, run.partition, offset))

    with trio.fail_after(120), local_nodes(etcd_url, cluster_name, tmp_path) as nodes:
        by_id = {node.node_id: node for node in nodes}
        await wait_status(etcd, keys, lambda s: fully_in_sync(s, TOPIC, 3), SETTLE)
        async with ClusterPublisher.open(
            [n.address for n in nodes], retry_for=SETTLE, idempotent=idempotent
        ) as publisher:
            record(0, await publisher.publish(KEY, [payload(0, 0), payload(0, 1)]))
            partition = acked[0].partition
            status = await read_status(etcd, keys)
            state = status.vbuckets[partition_vbuckets(TOPIC)[partition]].state
            leader = state.leader
            assert leader is not None
            # The first follower in preference order is elected once the
            # other one (paused past its lease) and the leader are gone.
            heir, paused = [node for node in state.replicas if node != leader]
            by_id[paused].send(signal.SIGSTOP)
            retried: list[AckedRun] = []

            async def publish_the_batch() -> None:
                retried.extend(await publisher.publish(KEY, [payload(0, 2), payload(0, 3)]))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish_the_batch)
                await trio.sleep(REPLICATED)
                assert not retried, "acked before the kill: the paused follower did not hold it"
                by_id[leader].stop(signal.SIGKILL)
                await wait_status(
                    etcd, keys, lambda s: leaders(s, TOPIC)[partition] == heir, SETTLE
                )
                by_id[paused].send(signal.SIGCONT)
                by_id[leader].start()
            record(2, retried)
            record(4, await publisher.publish(KEY, [payload(0, 4)]))
        await wait_status(etcd, keys, lambda s: fully_in_sync(s, TOPIC, 3), SETTLE)
        await trio.sleep(0.5)  # the last fetches carry the final high watermark
        for node in nodes:
            node.stop(signal.SIGTERM)
        replicas = {n.node_id: n.records(TOPIC.name) for n in nodes}
        verdict = check(acked, replicas, by_id)
        # The batch was written in the deposed leader's epoch: the heir got
        # it by replication, before the retry reached it.
        history, _ = epochfile.load(str(by_id[heir].data_dir / TOPIC.name / str(partition)))
        heir_epoch_start = history.entries[-1][1]
        stored = Counter(
            decode_message(memoryview(message), "", 0).payload
            for _, _, message in replicas[heir][partition]
        )
    assert verdict.ok, verdict
    assert [a.seq for a in acked] == [0, 1, 2, 3, 4]
    first_of_batch = min(
        offset
        for offset, _, message in replicas[heir][partition]
        if decode_message(memoryview(message), "", 0).payload == payload(0, 2)
    )
    assert first_of_batch < heir_epoch_start
    if idempotent:
        assert verdict.duplicates == 0
        assert stored[payload(0, 2)] == stored[payload(0, 3)] == 1
        assert [a.offset for a in acked if a.seq == 2] == [first_of_batch]
    else:
        # Without idempotence every attempt that reached a leader is stored:
        # at least the deposed leader's copy and the retry's, more when a
        # loaded machine made the publisher time out an attempt and retry
        # again (its 3 s attempt timeout).
        assert verdict.duplicates >= 2
        assert stored[payload(0, 2)] == stored[payload(0, 3)] >= 2
