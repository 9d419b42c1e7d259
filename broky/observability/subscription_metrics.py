"""Prometheus families of durable subscriptions (``broky_subscription_*``).

Labelled by ``subscription`` (never by consumer, key or connection), and
bounded: a worker exports at most ``MAX_LABELLED_SUBSCRIPTIONS`` of them,
the ones with the largest backlog; the ``/subscriptions`` listing has them
all. Each family is one figure of ``SubscriptionStatus``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from broky.subscriptions.watch import SubscriptionStatus

if TYPE_CHECKING:
    from broky.observability.metrics import WorkerSample

#: Subscriptions one worker labels in metrics: a scrape stays a few
#: thousand lines whatever the number of subscriptions.
MAX_LABELLED_SUBSCRIPTIONS: Final = 100

#: (family, type, help, figure) for each exported figure.
SUBSCRIPTION_FAMILIES: Final = (
    ("broky_subscription_backlog_messages", "gauge", "Messages not acked yet (lag).", "backlog"),
    (
        "broky_subscription_in_flight_messages",
        "gauge",
        "Messages delivered and not acked yet.",
        "in_flight",
    ),
    ("broky_subscription_consumers", "gauge", "Consumers attached now.", "consumers"),
    (
        "broky_subscription_delivered_messages",
        "counter",
        "Deliveries, redeliveries included.",
        "delivered",
    ),
    (
        "broky_subscription_redelivered_messages",
        "counter",
        "Deliveries of a message delivered before (nack, timeout, a consumer gone).",
        "redelivered",
    ),
    ("broky_subscription_acked_messages", "counter", "Offsets acked by consumers.", "acked"),
    (
        "broky_subscription_dead_lettered_messages",
        "counter",
        "Messages moved to the dead-letter topic.",
        "dead_lettered",
    ),
)


def labelled(statuses: tuple[SubscriptionStatus, ...]) -> list[SubscriptionStatus]:
    """The statuses a worker exports: the largest backlogs first, bounded."""
    ranked = sorted(statuses, key=lambda status: (-status.backlog, status.name))
    return ranked[:MAX_LABELLED_SUBSCRIPTIONS]


def subscription_families(samples: list[WorkerSample]) -> Iterator[Metric]:
    labels = ["worker", "subscription"]
    chosen = [(sample.worker, labelled(sample.broker.subscriptions)) for sample in samples]
    for name, kind, doc, figure in SUBSCRIPTION_FAMILIES:
        family: CounterMetricFamily | GaugeMetricFamily = (
            CounterMetricFamily(name, doc, labels=labels)
            if kind == "counter"
            else GaugeMetricFamily(name, doc, labels=labels)
        )
        for worker, statuses in chosen:
            for status in statuses:
                family.add_metric([worker, status.name], getattr(status, figure))
        yield family
    stalled = GaugeMetricFamily(
        "broky_subscription_stalled",
        "1 while a subscription is stalled (messages waiting, none delivered for a "
        "second), by reason; see $SYS.events.subscription.stalled.",
        labels=["worker", "subscription", "reason"],
    )
    for worker, statuses in chosen:
        for status in statuses:
            if status.stalled:
                stalled.add_metric([worker, status.name, status.stalled], 1)
    yield stalled
