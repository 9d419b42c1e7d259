"""The Prometheus collector: broker statistics as metric families.

Nothing here counts anything. At each scrape the collector asks its source
for one ``WorkerSample`` per worker (today one; each worker process will run
its own ``Broker``) and turns the primitives' snapshots into families. So a
scrape costs one ``statistics()`` call per worker, and there is no second set
of counters to drift from the first.

Labels are bounded: ``worker`` (one per worker process), ``reason`` (the
``CloseReason`` and drop-reason enums), ``kind`` (advisory kinds) and
``topic`` (only the K busiest keys, see ``topics.py``), and the bounded
replication labels of ``replication_metrics.py``. No label carries a
client address or name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

import attrs
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from broky.connection.reasons import CloseReason
from broky.observability.lag import LAG_BUCKETS
from broky.observability.replication_metrics import (
    REPLICATION_FAMILIES,
    replication_families,
)
from broky.observability.subscription_metrics import SUBSCRIPTION_FAMILIES, subscription_families

if TYPE_CHECKING:
    from broky.server import BrokerStatistics

#: Why a message was dropped: the values of the ``reason`` label of
#: ``broky_dropped_messages_total``.
DROP_REASONS: Final = ("no_subscriber", "slow_consumer")


@attrs.frozen
class LoopLag:
    """Loop-lag histogram of one worker (see ``lag.LoopLagProbe``)."""

    bucket_counts: tuple[int, ...]
    samples: int
    total_seconds: float


@attrs.frozen
class WorkerSample:
    """Everything the collector exports about one worker."""

    worker: str
    broker: BrokerStatistics
    loop_lag: LoopLag
    #: Advisories published on ``$SYS.events.*``, by kind.
    advisories: Mapping[str, int]


#: Every family the collector exports (without the _total suffix that
#: prometheus_client adds to counter samples), with its type. The README's
#: metrics table lists exactly these; a test keeps the two in step.
FAMILIES: Final = {
    "broky_connections": "gauge",
    "broky_connections_opened": "counter",
    "broky_connections_closed": "counter",
    "broky_received_bytes": "counter",
    "broky_sent_bytes": "counter",
    "broky_published_messages": "counter",
    "broky_published_runs": "counter",
    "broky_delivered_messages": "counter",
    "broky_dropped_messages": "counter",
    "broky_slow_consumer_disconnects": "counter",
    "broky_subscriptions": "gauge",
    "broky_topics": "gauge",
    "broky_match_cache_keys": "gauge",
    "broky_outbox_messages": "gauge",
    "broky_outbox_bytes": "gauge",
    "broky_loop_lag_seconds": "histogram",
    "broky_topic_published_messages": "counter",
    "broky_topic_published_bytes": "counter",
    "broky_advisories": "counter",
    "broky_link_queued_bytes": "gauge",
    "broky_link_forwarded_messages": "counter",
    "broky_link_dropped_messages": "counter",
    "broky_link_connected": "gauge",
    "broky_link_received_messages": "counter",
    "broky_durable_appended_messages": "counter",
    "broky_durable_appended_bytes": "counter",
    "broky_durable_fsyncs": "counter",
    "broky_durable_log_bytes": "gauge",
    "broky_durable_recovery_truncated_bytes": "counter",
    "broky_durable_forwarded_messages": "counter",
    **{name: kind for name, kind, _, _ in SUBSCRIPTION_FAMILIES},
    "broky_subscription_stalled": "gauge",
    **REPLICATION_FAMILIES,
}


class BrokerCollector(Collector):
    """Exports ``source()``'s samples; register it on a ``CollectorRegistry``.

    Call ``collect`` only on the broker's trio thread (the ``/metrics``
    handler does): the statistics are read without locks.
    """

    def __init__(self, source: Callable[[], Iterable[WorkerSample]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        samples = list(self._source())
        labels = ["worker"]

        def counter(name: str, doc: str, value: Callable[[WorkerSample], int]) -> Metric:
            family = CounterMetricFamily(name, doc, labels=labels)
            for sample in samples:
                family.add_metric([sample.worker], value(sample))
            return family

        def gauge(name: str, doc: str, value: Callable[[WorkerSample], float]) -> Metric:
            family = GaugeMetricFamily(name, doc, labels=labels)
            for sample in samples:
                family.add_metric([sample.worker], value(sample))
            return family

        yield gauge(
            "broky_connections", "Connections open now.", lambda s: s.broker.connections_current
        )
        yield counter(
            "broky_connections_opened",
            "Connections accepted (network and in-process).",
            lambda s: s.broker.connections_opened,
        )
        closed = CounterMetricFamily(
            "broky_connections_closed",
            "Connections closed, by reason (see docs/architecture.md).",
            labels=["worker", "reason"],
        )
        for sample in samples:
            for reason in CloseReason:
                closed.add_metric(
                    [sample.worker, reason.value],
                    sample.broker.connections_closed.get(reason.value, 0),
                )
        yield closed
        yield counter(
            "broky_received_bytes",
            "Bytes read from client sockets.",
            lambda s: s.broker.bytes_received,
        )
        yield counter(
            "broky_sent_bytes", "Bytes written to client sockets.", lambda s: s.broker.bytes_sent
        )
        yield counter(
            "broky_published_messages",
            "Messages routed (valid keys), whether or not anyone subscribed.",
            lambda s: s.broker.router.published_messages,
        )
        yield counter(
            "broky_published_runs",
            "Runs routed: one key lookup each.",
            lambda s: s.broker.router.published_runs,
        )
        yield counter(
            "broky_delivered_messages",
            "Messages handed to subscriber connections (one per subscription).",
            lambda s: s.broker.router.delivered_messages,
        )
        dropped = CounterMetricFamily(
            "broky_dropped_messages",
            "Messages dropped: no_subscriber (nobody matched) or slow_consumer (an outbox "
            "was full; counted per subscription).",
            labels=["worker", "reason"],
        )
        for sample in samples:
            router = sample.broker.router
            dropped.add_metric([sample.worker, "no_subscriber"], router.dropped_no_subscriber)
            dropped.add_metric([sample.worker, "slow_consumer"], router.dropped_slow_consumer)
        yield dropped
        yield counter(
            "broky_slow_consumer_disconnects",
            "Connections closed because a subscription with the disconnect policy overflowed.",
            lambda s: s.broker.router.slow_consumer_disconnects,
        )
        yield gauge(
            "broky_subscriptions",
            "Subscriptions open now.",
            lambda s: s.broker.router.subscriptions,
        )
        yield gauge(
            "broky_topics",
            "Distinct subscribed patterns (a topic exists while someone subscribes).",
            lambda s: s.broker.router.topics,
        )
        yield gauge(
            "broky_match_cache_keys",
            "Keys in the router's match cache.",
            lambda s: s.broker.router.match_cache_keys,
        )
        yield gauge(
            "broky_outbox_messages",
            "Messages queued in subscription outboxes, all subscriptions together.",
            lambda s: s.broker.router.outbox_messages,
        )
        yield gauge(
            "broky_outbox_bytes",
            "Bytes queued in subscription outboxes, all subscriptions together.",
            lambda s: s.broker.router.outbox_bytes,
        )
        lag = HistogramMetricFamily(
            "broky_loop_lag_seconds",
            "How late the broker's event loop (and so its router) ran a task that was due.",
            labels=labels,
        )
        bounds = [*(repr(bound) for bound in LAG_BUCKETS), "+Inf"]
        for sample in samples:
            lag.add_metric(
                [sample.worker],
                list(zip(bounds, sample.loop_lag.bucket_counts, strict=True)),
                sample.loop_lag.total_seconds,
            )
        yield lag
        topic_messages = CounterMetricFamily(
            "broky_topic_published_messages",
            "Messages published per key, for the K busiest keys only (metrics_top_topics).",
            labels=["worker", "topic"],
        )
        topic_bytes = CounterMetricFamily(
            "broky_topic_published_bytes",
            "Run bytes published per key, for the K busiest keys only (metrics_top_topics).",
            labels=["worker", "topic"],
        )
        for sample in samples:
            for topic in sample.broker.router.top_topics:
                topic_messages.add_metric([sample.worker, topic.key], topic.messages)
                topic_bytes.add_metric([sample.worker, topic.key], topic.bytes)
        yield topic_messages
        yield topic_bytes
        advisories = CounterMetricFamily(
            "broky_advisories",
            "Advisories published on $SYS.events.*, by kind.",
            labels=["worker", "kind"],
        )
        for sample in samples:
            for kind, count in sorted(sample.advisories.items()):
                advisories.add_metric([sample.worker, kind], count)
        yield advisories
        yield from _link_families(samples)
        yield from _durable_families(samples, counter, gauge)
        yield from subscription_families(samples)
        yield from replication_families(samples)


def _link_families(samples: list[WorkerSample]) -> Iterator[Metric]:
    """Per-link figures. The ``link`` label is the link's name (the peer
    router's worker or node address), so its values are bounded by the
    cluster's size and stable across reconnects."""
    labels = ["worker", "link", "kind"]
    queued = GaugeMetricFamily(
        "broky_link_queued_bytes",
        "Bytes queued for a peer router's link (bounded by link_outbox_bytes).",
        labels=labels,
    )
    forwarded = CounterMetricFamily(
        "broky_link_forwarded_messages",
        "Messages forwarded to a peer router over its link.",
        labels=labels,
    )
    dropped = CounterMetricFamily(
        "broky_link_dropped_messages",
        "Messages dropped for a peer router whose link fell behind.",
        labels=labels,
    )
    connected = GaugeMetricFamily(
        "broky_link_connected",
        "1 while this router's outgoing link to a peer is connected.",
        labels=labels,
    )
    received = CounterMetricFamily(
        "broky_link_received_messages",
        "Messages received from a peer router over this router's outgoing link.",
        labels=labels,
    )
    for sample in samples:
        for link in sample.broker.router.links:
            name = [sample.worker, link.peer.split("@", 1)[0], link.kind]
            queued.add_metric(name, link.queued_bytes)
            forwarded.add_metric(name, link.forwarded_messages)
            dropped.add_metric(name, link.dropped_messages)
        for status in sample.broker.links:
            name = [sample.worker, status.name, status.kind]
            connected.add_metric(name, 1 if status.connected else 0)
            received.add_metric(name, status.received_messages)
    yield from (queued, forwarded, dropped, connected, received)


def _durable_families(
    samples: list[WorkerSample],
    counter: Callable[[str, str, Callable[[WorkerSample], int]], Metric],
    gauge: Callable[[str, str, Callable[[WorkerSample], float]], Metric],
) -> Iterator[Metric]:
    """Durable topics' totals; zero for a worker without durable topics."""

    def durable(figure: str) -> Callable[[WorkerSample], int]:
        def value(sample: WorkerSample) -> int:
            statistics = sample.broker.durable
            return int(getattr(statistics, figure)) if statistics is not None else 0

        return value

    yield counter(
        "broky_durable_appended_messages",
        "Messages appended to durable topic logs.",
        durable("appended_messages"),
    )
    yield counter(
        "broky_durable_appended_bytes",
        "Bytes appended to durable topic logs (batch headers included).",
        durable("appended_bytes"),
    )
    yield counter(
        "broky_durable_fsyncs",
        "fsyncs of durable topic logs (one covers a group of batches).",
        durable("fsyncs"),
    )
    yield gauge(
        "broky_durable_log_bytes", "Bytes held by durable topic logs.", durable("size_bytes")
    )
    yield counter(
        "broky_durable_recovery_truncated_bytes",
        "Torn tail bytes cut when the logs were opened (recovery after a crash).",
        durable("recovery_truncated_bytes"),
    )
    yield counter(
        "broky_durable_forwarded_messages",
        "Acked durable messages this worker's clients published to partitions other "
        "workers own (forwarded to the owner over its channel).",
        durable("forwarded_messages"),
    )


def broker_registry(source: Callable[[], Iterable[WorkerSample]]) -> CollectorRegistry:
    """A registry of the broker's families plus the standard ``process_*`` ones.

    A registry of its own, not prometheus_client's global one: several brokers
    may live in one process (tests, embedding).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(source))
    ProcessCollector(registry=registry)
    return registry
