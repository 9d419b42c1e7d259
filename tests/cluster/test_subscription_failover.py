"""A durable subscription's state survives the SIGKILL of its partition's leader.

Three nodes, one replicated partition. A publisher publishes with acks while
a consumer of subscription ``billing`` acks everything it gets; once part of
the stream is acked, the partition's leader is SIGKILLed. The consumer finds
the new leader and attaches again by itself (``ClusterConsumer``, issue 13
gap 5: no error reaches the application); the new leader serves the
subscription from the state its followers copied
(broky.subscriptions.replica). Checked:

- nothing is lost: every acknowledged publish is delivered and acked by
  the consumer in the end (a message never delivered would leave a gap);
- an ack whose receipt came more than ``WINDOW`` before the kill is never
  redelivered: the documented window is one fetch round trip, and WINDOW
  leaves a loaded CI box room (without replicated state the new leader
  would start the subscription over and redeliver them all);
- receipted acks redelivered from inside the window are counted, reported.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
import trio

from broky import Start
from broky.client.cluster_consumer import ClusterConsumer, ClusterConsumerStatistics
from broky.client.errors import BrokyError
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.replication.local_cluster import TopicSpec, fully_in_sync, leaders
from tests.cluster.replicated import leader_node, local_nodes, publish_numbered, wait_status

SETTLE = 30.0
ONE_PARTITION = TopicSpec(partitions=1)
#: Acked publishes, in batches of BATCH.
MESSAGES = 1500
BATCH = 10
#: Seconds between a publisher's batches: the stream lasts ~3 s, under load
#: before and after the kill.
PUBLISH_PAUSE = 0.02
#: Receipted acks before the kill.
BEFORE_KILL = 200
#: Seconds before the kill past which a receipted ack must not come back.
WINDOW = 0.5


@pytest.fixture
def cluster_name(prefix: bytes) -> str:
    return "s" + prefix.decode().strip("/").replace("/", "-")


async def test_acked_subscription_state_survives_a_leader_kill(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    keys = ClusterKeys.for_cluster(cluster_name)
    published: dict[int, bytes] = {}
    #: Offset -> time its ack's receipt arrived.
    receipted: dict[int, float] = {}
    #: Offsets whose ack the consumer sent (an ack sent just before the kill
    #: may have been committed without its receipt reaching the consumer:
    #: then it is neither redelivered nor receipted, and that is right).
    acked: set[int] = set()
    #: Deliveries of each offset.
    deliveries: Counter[int] = Counter()
    killed_at: float | None = None
    followed: list[ClusterConsumerStatistics] = []
    with (
        trio.fail_after(90),
        local_nodes(etcd_url, cluster_name, tmp_path, topic=ONE_PARTITION) as nodes,
    ):
        await wait_status(etcd, keys, lambda s: fully_in_sync(s, ONE_PARTITION, 3), SETTLE)
        first_leader = await leader_node(etcd, keys, nodes, ONE_PARTITION)
        enough = trio.Event()

        async def publish() -> None:
            seeds = [n.address for n in nodes]
            await publish_numbered(seeds, "orders.bill", MESSAGES, BATCH, PUBLISH_PAUSE, published)

        async def consume() -> None:
            """Ack everything with one ClusterConsumer: it follows the
            partition's leader by itself (no error reaches this loop)."""
            async with ClusterConsumer.open(
                [n.address for n in nodes],
                "orders.>",
                subscription="billing",
                start=Start.earliest(),
                ack_interval=0.01,
                retry_for=SETTLE,
            ) as consumer:
                followed.append(consumer.stats)
                unreceipted: list[int] = []
                async for message in consumer:
                    deliveries[message.offset] += 1
                    await message.ack()
                    acked.add(message.offset)
                    unreceipted.append(message.offset)
                    if len(unreceipted) >= 20 or len(acked) >= MESSAGES:
                        # Bounded: a receipt lost with the connection must
                        # fail the flush, not hang it.
                        try:
                            with trio.fail_after(10):
                                await consumer.flush()
                        except (BrokyError, trio.TooSlowError):
                            unreceipted.clear()  # left in the failover: not receipted
                            continue
                        now = trio.current_time()
                        for offset in unreceipted:
                            receipted.setdefault(offset, now)
                        unreceipted.clear()
                        if len(receipted) >= BEFORE_KILL:
                            enough.set()
                        if len(acked) >= MESSAGES:
                            return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            nursery.start_soon(consume)
            await enough.wait()
            await trio.sleep(2 * WINDOW)  # acks keep flowing up to the kill
            killed_at = trio.current_time()
            first_leader.stop(signal.SIGKILL)
            await wait_status(
                etcd, keys, lambda s: leaders(s, ONE_PARTITION)[0] != first_leader.node_id, SETTLE
            )
            first_leader.start()
    assert killed_at is not None
    # Delivered again although the first delivery's ack was receipted
    # before the kill (a redelivery of an unreceipted ack is allowed).
    redelivered = [
        o for o, n in deliveries.items() if n > 1 and receipted.get(o, killed_at) < killed_at
    ]
    early = [o for o in redelivered if receipted[o] < killed_at - WINDOW]
    print(
        f"published {len(published)}, receipted {len(receipted)}, receipted before the kill "
        f"{sum(1 for t in receipted.values() if t < killed_at)}, redelivered after it "
        f"{len(redelivered)} (from the last {WINDOW} s: {len(redelivered) - len(early)})"
    )
    assert sum(1 for t in receipted.values() if t < killed_at - WINDOW) >= BEFORE_KILL
    assert len(published) == MESSAGES
    assert published.keys() <= acked, sorted(published.keys() - acked)[:10]
    assert early == [], early[:10]
    [stats] = followed
    assert stats.attaches >= 2, "the consumer never attached again after the kill"
