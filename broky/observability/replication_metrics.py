"""Prometheus families of a cluster member's replication (``broky_replication_*``).

Node-wide figures are labelled by ``worker`` only. Per-partition figures
(high watermark, follower lag) are labelled by ``topic``, ``partition`` and,
for lag, ``follower``: topics and partition counts come from the
operator's configuration, never from clients, and followers are bounded by
the replication factor; still, a worker exports at most
``MAX_LABELLED_PARTITIONS`` of the partitions it leads, the most lagging
first, so a scrape stays small with thousands of partitions. Only the
leader exports a partition's figures: it is the one whose high watermark
and view of its followers are authoritative, and one series per partition
per cluster is what an alert wants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from broky.observability.metrics import WorkerSample
    from broky.replication.events import PartitionReplication, ReplicationStatistics

#: Led partitions one worker labels in metrics.
MAX_LABELLED_PARTITIONS: Final = 100


def _family(name: str, kind: str, doc: str) -> CounterMetricFamily | GaugeMetricFamily:
    """A family labelled by worker only."""
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=["worker"])
    return GaugeMetricFamily(name, doc, labels=["worker"])


#: (family, type, help, figure) of the node-wide families.
_NODE_WIDE: Final[tuple[tuple[str, str, str, Callable[[ReplicationStatistics], int]], ...]] = (
    (
        "broky_replication_leader_partitions",
        "gauge",
        "Replicated partitions this node leads now.",
        lambda s: sum(p.role == "leader" for p in s.partitions),
    ),
    (
        "broky_replication_under_replicated_partitions",
        "gauge",
        "Led partitions whose ISR is smaller than their replica set "
        "(see $SYS.events.cluster.under_replicated).",
        lambda s: sum(p.under_replicated for p in s.partitions),
    ),
    (
        "broky_replication_leader_changes",
        "counter",
        "Times this node started leading a partition (one per new epoch).",
        lambda s: s.leader_changes,
    ),
    (
        "broky_replication_isr_shrinks",
        "counter",
        "Replicas removed from the ISRs of partitions this node led.",
        lambda s: s.isr_shrinks,
    ),
    (
        "broky_replication_isr_expands",
        "counter",
        "Replicas added back to the ISRs of partitions this node led.",
        lambda s: s.isr_expands,
    ),
)


#: (family, type) of every family exported here.
REPLICATION_FAMILIES: Final = {
    **{name: kind for name, kind, _, _ in _NODE_WIDE},
    "broky_replication_high_watermark": "gauge",
    "broky_replication_follower_lag_messages": "gauge",
}


def labelled(partitions: tuple[PartitionReplication, ...]) -> list[PartitionReplication]:
    """The led partitions a worker exports: the most lagging first, bounded."""
    led = [partition for partition in partitions if partition.role == "leader"]
    led.sort(key=lambda p: (-p.max_lag, p.topic, p.partition))
    return led[:MAX_LABELLED_PARTITIONS]


def replication_families(samples: list[WorkerSample]) -> Iterator[Metric]:
    """Every family, empty of samples for a worker that does not replicate."""
    replicating = [
        (sample.worker, sample.broker.replication)
        for sample in samples
        if sample.broker.replication is not None
    ]
    node_wide: list[tuple[CounterMetricFamily | GaugeMetricFamily, Callable[..., int]]] = [
        (_family(name, kind, doc), value) for name, kind, doc, value in _NODE_WIDE
    ]
    watermark = GaugeMetricFamily(
        "broky_replication_high_watermark",
        "A led partition's high watermark (consumers read below it).",
        labels=["worker", "topic", "partition"],
    )
    lag = GaugeMetricFamily(
        "broky_replication_follower_lag_messages",
        "Messages a follower's fsynced log is behind its leader's log end.",
        labels=["worker", "topic", "partition", "follower"],
    )
    for worker, statistics in replicating:
        assert statistics is not None
        for node_family, value in node_wide:
            node_family.add_metric([worker], value(statistics))
        for partition in labelled(statistics.partitions):
            name = [worker, partition.topic, str(partition.partition)]
            watermark.add_metric(name, partition.high_watermark)
            for follower, behind in partition.follower_lag:
                lag.add_metric([*name, follower], behind)
    yield from (node_family for node_family, _ in node_wide)
    yield from (watermark, lag)
