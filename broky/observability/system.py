"""System topics: ``$SYS.metrics`` snapshots and ``$SYS.events.*`` advisories.

Both are ordinary messages routed by the broker's own router (a run with no
origin connection), so subscribers get them exactly as they get any message:
same protocol, same outbox bounds, same slow-consumer policy. Keys start with
``$SYS``, so only patterns that start with ``$SYS`` see them: a catch-all
``>`` subscriber never does.

Payloads are UTF-8 JSON objects (one per message) whose first field is
``"version": 1``; fields are added, never renamed, within a version. The
formats are in the README ("System topics").

Publishing happens from this module's own tasks (or, for a connection close,
from the closing connection's task after it left the router), never from
inside a router call, so an advisory can never re-enter ``Router.publish``.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from broky.connection.reasons import CloseReason
from broky.observability.keys import EVENTS_PREFIX, METRICS_KEY
from broky.observability.metrics import WorkerSample
from broky.protocol.frames import Run
from broky.protocol.message import encode_message, pack_sizes
from broky.router.router import Router

if TYPE_CHECKING:
    from broky.connection.handler import ServerConnection
    from broky.router.outbox import Subscription

log = logging.getLogger("broky.system")

#: Version of every payload's format.
PAYLOAD_VERSION: Final = 1
#: Seconds between two checks for dropping subscriptions: an advisory names
#: the drops of at most this long, so a subscriber dropping a million
#: messages a second causes one advisory a second, not a million.
ADVISORY_TICK: Final = 1.0
#: Most subscriptions a ``dropped`` advisory lists (the worst first).
MAX_LISTED_SUBSCRIPTIONS: Final = 10


class Advisory(enum.Enum):
    """Advisory kinds; the value is the key suffix after ``$SYS.events.``
    and the ``kind`` label of ``broky_advisories_total``."""

    SLOW_CONSUMER = "slow_consumer"
    """A subscription started dropping, or its connection was cut for it."""
    DROPPED = "dropped"
    """Messages were dropped for slow subscriptions in the last tick."""
    CONNECTION_CLOSED = "connection.closed"
    """A connection ended, with its enumerated reason."""
    CONFIG_RELOADED = "config.reloaded"
    """A reload (SIGHUP) applied new users, permissions or certificates."""
    SUBSCRIPTION_STALLED = "subscription.stalled"
    """A durable subscription has messages waiting and cannot deliver them
    (broky.subscriptions.watch says why)."""
    SUBSCRIPTION_RESUMED = "subscription.resumed"
    """A stalled durable subscription delivers again."""
    SUBSCRIPTION_REDELIVERY_STORM = "subscription.redelivery_storm"
    """Redeliveries exceed a fifth of a subscription's deliveries over 10 s."""
    SUBSCRIPTION_DEAD_LETTERED = "subscription.dead_lettered"
    """A message went to its subscription's dead-letter topic."""
    SUBSCRIPTION_CONSUMER_EVICTED = "subscription.consumer_evicted"
    """A consumer held messages without progress for twice the ack timeout."""
    SUBSCRIPTION_DELETED = "subscription.deleted"
    """A worker deleted its share of a durable subscription (DeleteSubscription)."""
    CLUSTER_LEADER_CHANGED = "cluster.leader_changed"
    """This node started leading a replicated partition at a new epoch."""
    CLUSTER_ISR_SHRUNK = "cluster.isr_shrunk"
    """Replicas left a partition's ISR (etcd has the change)."""
    CLUSTER_ISR_EXPANDED = "cluster.isr_expanded"
    """Replicas caught up and rejoined a partition's ISR."""
    CLUSTER_UNDER_REPLICATED = "cluster.under_replicated"
    """A led partition's ISR became smaller than its replica set."""
    CLUSTER_FULLY_REPLICATED = "cluster.fully_replicated"
    """An under-replicated partition's ISR holds every replica again."""


def _rate(now: int, before: int | None, seconds: float) -> float:
    if before is None or seconds <= 0 or now < before:
        return 0.0
    return round((now - before) / seconds, 1)


def metrics_snapshot(
    sample: WorkerSample,
    *,
    timestamp_ns: int,
    uptime_seconds: float,
    loop_lag_max_seconds: float,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``$SYS.metrics`` payload for one worker, as a JSON-able dict.

    Rates are over the time since ``previous`` (the last snapshot published),
    so they are exact averages over the interval, not samples.
    """
    stats = sample.broker
    router = stats.router
    seconds = 0.0
    old_messages: Mapping[str, Any] = {}
    old_bytes: Mapping[str, Any] = {}
    old_topics: dict[str, int] = {}
    if previous is not None:
        seconds = (timestamp_ns - previous["ts"]) / 1e9
        old_messages, old_bytes = previous["messages"], previous["bytes"]
        old_topics = {topic["topic"]: topic["messages"] for topic in previous["top_topics"]}
    dropped = router.dropped_no_subscriber + router.dropped_slow_consumer
    old_dropped = (
        old_messages["dropped_no_subscriber"] + old_messages["dropped_slow_consumer"]
        if old_messages
        else None
    )
    lag = sample.loop_lag
    return {
        "version": PAYLOAD_VERSION,
        "worker": sample.worker,
        "ts": timestamp_ns,
        "uptime_seconds": round(uptime_seconds, 3),
        "interval_seconds": round(seconds, 3),
        "connections": {
            "current": stats.connections_current,
            "opened": stats.connections_opened,
            "closed": {
                reason.value: stats.connections_closed.get(reason.value, 0)
                for reason in CloseReason
            },
        },
        "subscriptions": router.subscriptions,
        "topics": router.topics,
        "messages": {
            "published": router.published_messages,
            "delivered": router.delivered_messages,
            "dropped_no_subscriber": router.dropped_no_subscriber,
            "dropped_slow_consumer": router.dropped_slow_consumer,
            "from_links": router.from_links,
            "to_links": router.to_links,
        },
        "bytes": {"received": stats.bytes_received, "sent": stats.bytes_sent},
        "rates": {
            "published_per_s": _rate(
                router.published_messages, old_messages.get("published"), seconds
            ),
            "delivered_per_s": _rate(
                router.delivered_messages, old_messages.get("delivered"), seconds
            ),
            "dropped_per_s": _rate(dropped, old_dropped, seconds),
            "from_links_per_s": _rate(router.from_links, old_messages.get("from_links"), seconds),
            "to_links_per_s": _rate(router.to_links, old_messages.get("to_links"), seconds),
            "received_bytes_per_s": _rate(stats.bytes_received, old_bytes.get("received"), seconds),
            "sent_bytes_per_s": _rate(stats.bytes_sent, old_bytes.get("sent"), seconds),
        },
        "queues": {"outbox_messages": router.outbox_messages, "outbox_bytes": router.outbox_bytes},
        "slow_consumer_disconnects": router.slow_consumer_disconnects,
        "loop_lag": {
            "recent_max_seconds": round(loop_lag_max_seconds, 6),
            "mean_seconds": round(lag.total_seconds / lag.samples, 6) if lag.samples else 0.0,
        },
        "durable_subscriptions": [attrs.asdict(status) for status in stats.subscriptions],
        "top_topics": [
            {
                "topic": topic.key,
                "messages": topic.messages,
                "bytes": topic.bytes,
                "messages_per_s": _rate(topic.messages, old_topics.get(topic.key), seconds),
            }
            for topic in router.top_topics
        ],
    }


class SystemTopics:
    """Publishes the snapshots and advisories of one broker (one worker).

    ``sample`` gives the worker's figures; ``connections`` the live
    connections (to find subscriptions that drop). Both are read on the
    broker's thread.
    """

    def __init__(
        self,
        router: Router,
        sample: Callable[[], WorkerSample],
        connections: Callable[[], Iterable[ServerConnection]],
        *,
        metrics_interval: float,
        events: bool,
        loop_lag_max: Callable[[], float],
    ) -> None:
        self._router = router
        self._sample = sample
        self._connections = connections
        self.metrics_interval = metrics_interval
        self.events = events
        self._loop_lag_max = loop_lag_max
        self._started = time.monotonic()
        self.last_snapshot: dict[str, Any] | None = None
        #: Advisories published, by kind value (every kind present, from 0).
        self.advisories: dict[str, int] = {kind.value: 0 for kind in Advisory}
        #: Drops seen per live subscription at the last check, and which
        #: subscriptions were dropping then (a slow-consumer episode).
        self._seen_drops: dict[Subscription, int] = {}
        self._dropping: set[Subscription] = set()
        self._last_totals: tuple[int, int] | None = None

    def publish_json(self, key: str, payload: Mapping[str, Any]) -> bool:
        """Route one JSON message on ``key`` (stamped with ts_broker), if
        anyone subscribes to it: nobody listening means nothing to count."""
        router = self._router
        if not router.has_subscribers(key.encode()):
            return False
        message = encode_message(
            json.dumps(payload, separators=(",", ":")).encode(), ts_producer=time.time_ns()
        )
        run = Run(key.encode(), 0, 1, pack_sizes([len(message)]), message)
        router.publish(router.encode([run], stamp_ts_broker=True))
        return True

    def advise(self, kind: Advisory, payload: dict[str, Any]) -> None:
        """Publish one advisory on ``$SYS.events.<kind>`` (if events are on
        and anyone listens; only published advisories are counted)."""
        if self.events and self.publish_json(
            EVENTS_PREFIX + kind.value,
            {"version": PAYLOAD_VERSION, "kind": kind.value, "ts": time.time_ns(), **payload},
        ):
            self.advisories[kind.value] += 1

    def publish_snapshot(self) -> dict[str, Any]:
        """Build, publish and remember one ``$SYS.metrics`` snapshot."""
        snapshot = metrics_snapshot(
            self._sample(),
            timestamp_ns=time.time_ns(),
            uptime_seconds=time.monotonic() - self._started,
            loop_lag_max_seconds=self._loop_lag_max(),
            previous=self.last_snapshot,
        )
        # Which node: in a cluster, every node's snapshots reach a subscriber.
        snapshot["node"] = self._router.node_id
        self.publish_json(METRICS_KEY, snapshot)
        self.last_snapshot = snapshot
        return snapshot

    def connection_closed(self, connection: ServerConnection) -> None:
        """Advise that ``connection`` ended (called once its task is done)."""
        reason, detail = connection.close_reason
        who = {"connection": connection.peer, "client": connection.client_name}
        self.advise(Advisory.CONNECTION_CLOSED, {**who, "reason": reason.value, "detail": detail})
        if reason is CloseReason.SLOW_CONSUMER:
            self.advise(Advisory.SLOW_CONSUMER, {**who, "policy": "disconnect", "detail": detail})

    def check_drops(self) -> None:
        """Advise about subscriptions that dropped since the last check."""
        seen: dict[Subscription, int] = {}
        dropping: list[tuple[int, dict[str, Any]]] = []
        now_dropping: set[Subscription] = set()
        for connection in self._connections():
            for subscription in connection.outlet.subscriptions.values():
                total = subscription.dropped_messages
                seen[subscription] = total
                before = self._seen_drops.get(subscription, 0)
                if total <= before:
                    continue
                info = {
                    "connection": connection.peer,
                    "client": connection.client_name,
                    "stream": subscription.stream,
                    "pattern": subscription.pattern.decode(errors="replace"),
                    "policy": subscription.policy.name.lower(),
                    "dropped": total - before,
                    "dropped_total": total,
                    "pending_messages": subscription.pending_messages,
                    "pending_bytes": subscription.pending_bytes,
                }
                if subscription not in self._dropping:  # a new episode
                    self.advise(Advisory.SLOW_CONSUMER, info)
                now_dropping.add(subscription)
                dropping.append((total - before, info))
        self._seen_drops = seen
        self._dropping = now_dropping
        router = self._router.counters
        totals = (router.dropped_no_subscriber, router.dropped_slow_consumer)
        previous, self._last_totals = self._last_totals, totals
        if dropping:
            dropping.sort(key=lambda item: -item[0])
            self.advise(
                Advisory.DROPPED,
                {
                    "interval_seconds": ADVISORY_TICK,
                    "slow_consumer": totals[1] - previous[1] if previous else totals[1],
                    "no_subscriber": totals[0] - previous[0] if previous else totals[0],
                    "subscriptions": [info for _, info in dropping[:MAX_LISTED_SUBSCRIPTIONS]],
                },
            )

    async def run(self) -> None:
        """Publish snapshots and check for drops until cancelled."""
        async with trio.open_nursery() as nursery:
            if self.metrics_interval > 0:
                nursery.start_soon(self._every, self.metrics_interval, self.publish_snapshot)
            if self.events:
                nursery.start_soon(self._every, ADVISORY_TICK, self.check_drops)

    @staticmethod
    async def _every(interval: float, action: Callable[[], object]) -> None:
        # Deadlines, not sleeps: a slow tick does not push the next ones back.
        deadline = trio.current_time()
        while True:
            deadline = max(deadline + interval, trio.current_time())
            await trio.sleep_until(deadline)
            action()
