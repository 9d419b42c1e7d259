"""A ClusterConsumer leaves a node that stops answering and follows the new leader.

Three nodes, one replicated partition. A publisher publishes with acks
while a ``ClusterConsumer`` acks everything it gets; part way through, the
partition's leader (the node the consumer reads from) is SIGSTOPped: its
sockets stay open, so no error and no EOF reach the consumer. It used to
wait on that connection for ever while the partition failed over; now an
unanswered ping gives the node up within about 4/3 of ``node_timeout``
(broky.client.cluster_consumer) and it attaches to the new leader.

Checked: every acknowledged publish is delivered with its payload (the
consumer acks at least once what the publisher was acked; redeliveries
are allowed), the consumer attached again, all within a bounded time.
etcd and the nodes run as processes on 127.0.0.1; the paused node is
resumed and every node killed by PID at the end.
"""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from broky import Start
from broky.client.cluster_consumer import NODE_TIMEOUT, ClusterConsumer
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.replication.local_cluster import TopicSpec, fully_in_sync, leaders
from tests.cluster.replicated import (
    SETTLE,
    leader_node,
    local_nodes,
    publish_numbered,
    wait_status,
)

ONE_PARTITION = TopicSpec(partitions=1)
#: Acked publishes, in batches of BATCH, a batch every PUBLISH_PAUSE s.
MESSAGES = 600
BATCH = 10
PUBLISH_PAUSE = 0.02
#: Deliveries before the leader is paused.
BEFORE_PAUSE = 100


async def test_a_consumer_leaves_a_paused_leader_and_gets_every_acked_message(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    keys = ClusterKeys.for_cluster(cluster_name)
    #: Offset -> payload, for every publish the cluster acked.
    published: dict[int, bytes] = {}
    #: Offset -> payload, for every delivery.
    delivered: dict[int, bytes] = {}
    attaches: list[int] = []
    with (
        trio.fail_after(120),
        local_nodes(etcd_url, cluster_name, tmp_path, topic=ONE_PARTITION) as nodes,
    ):
        await wait_status(etcd, keys, lambda s: fully_in_sync(s, ONE_PARTITION, 3), SETTLE)
        victim = await leader_node(etcd, keys, nodes, ONE_PARTITION)
        seeds = [node.address for node in nodes]
        enough = trio.Event()
        published_all = trio.Event()

        async def publish() -> None:
            await publish_numbered(seeds, "orders.bill", MESSAGES, BATCH, PUBLISH_PAUSE, published)
            published_all.set()

        async def consume(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                async with ClusterConsumer.open(
                    seeds,
                    "orders.>",
                    subscription="paused",
                    start=Start.earliest(),
                    ack_interval=0.01,
                    retry_for=SETTLE,
                ) as consumer:
                    async for message in consumer:
                        delivered[message.offset] = message.payload
                        await message.ack()
                        attaches[:] = [consumer.stats.attaches]
                        if len(delivered) >= BEFORE_PAUSE:
                            enough.set()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish)
                consuming = await nursery.start(consume)
                await enough.wait()
                victim.send(signal.SIGSTOP)
                paused_at = trio.current_time()
                await wait_status(
                    etcd,
                    keys,
                    lambda s: leaders(s, ONE_PARTITION)[0] not in (None, victim.node_id),
                    SETTLE,
                )
                await published_all.wait()
                # Before the fix: never (the consumer waits on the paused node).
                with trio.fail_after(SETTLE + 4 * NODE_TIMEOUT):
                    while not published.keys() <= delivered.keys():  # noqa: ASYNC110 - polled
                        await trio.sleep(0.05)
                consuming.cancel()
                print(
                    f"every acked message delivered {trio.current_time() - paused_at:.2f} s "
                    f"after the pause ({len(published)} published, {attaches[0]} attaches)"
                )
        finally:
            victim.send(signal.SIGCONT)
    assert len(published) == MESSAGES
    wrong = {o: p for o, p in published.items() if delivered.get(o) != p}
    assert wrong == {}, sorted(wrong)[:10]
    assert attaches[0] >= 2, "the consumer never attached again after the pause"
