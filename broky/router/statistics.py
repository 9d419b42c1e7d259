"""A router's live counters, and snapshots of its state and counters for metrics and ``$SYS``."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import attrs

from broky.observability.topics import TopicFigures
from broky.protocol.constants import LinkKind

if TYPE_CHECKING:
    # Types only: the outbox imports this module for RouterCounters.
    from broky.observability.topics import TopicCounter
    from broky.router.matcher import SubscriptionIndex
    from broky.router.outbox import Outlet, Subscription


@attrs.frozen
class RouterStatistics:
    """A snapshot of a router's state and counters."""

    connections: int
    subscriptions: int
    topics: int
    match_cache_keys: int
    published_messages: int
    published_runs: int
    delivered_messages: int
    dropped_no_subscriber: int
    dropped_slow_consumer: int
    slow_consumer_disconnects: int
    outbox_messages: int
    outbox_bytes: int
    links: tuple[LinkStatistics, ...] = ()
    #: The busiest keys, busiest first (at most ``RouterLimits.top_topics``),
    #: counting what this router's clients published (not what peers forwarded).
    top_topics: tuple[TopicFigures, ...] = ()
    #: Messages received from / handed to peer routers' links: a node's
    #: published and delivered figures are the workers' sums less these.
    from_links: int = 0
    to_links: int = 0


@attrs.frozen
class LinkStatistics:
    """What a router has queued for, forwarded to and dropped for one peer link."""

    peer: str
    kind: str
    subscriptions: int
    queued_messages: int
    queued_bytes: int
    forwarded_messages: int
    dropped_messages: int


@attrs.define(slots=True, eq=False)
class RouterCounters:
    """Monotonic counters shared by a router and its outboxes (one owner thread)."""

    published_messages: int = 0
    published_runs: int = 0
    delivered_messages: int = 0
    dropped_no_subscriber: int = 0
    dropped_slow_consumer: int = 0
    slow_consumer_disconnects: int = 0
    #: Messages of runs that came from peer routers (counted in
    #: ``published_messages`` too): a node's own publishes are the rest.
    from_links: int = 0


def router_statistics(
    counters: RouterCounters,
    outlets: Collection[Outlet],
    index: SubscriptionIndex[Subscription],
    topics: TopicCounter,
) -> RouterStatistics:
    """A snapshot of a router's state and counters (``Router.statistics``)."""
    outbox_messages = sum(outlet.pending_messages for outlet in outlets)
    outbox_bytes = sum(outlet.pending_bytes for outlet in outlets)
    return RouterStatistics(
        connections=len(outlets),
        subscriptions=len(index),
        topics=index.pattern_count,
        match_cache_keys=index.cache_size,
        published_messages=counters.published_messages,
        published_runs=counters.published_runs,
        delivered_messages=counters.delivered_messages,
        dropped_no_subscriber=counters.dropped_no_subscriber,
        dropped_slow_consumer=counters.dropped_slow_consumer,
        slow_consumer_disconnects=counters.slow_consumer_disconnects,
        outbox_messages=outbox_messages,
        outbox_bytes=outbox_bytes,
        top_topics=tuple(topics.top()),
        from_links=counters.from_links,
        to_links=sum(
            outlet.delivered_messages for outlet in outlets if outlet.kind is not LinkKind.CLIENT
        ),
        links=tuple(
            LinkStatistics(
                peer=outlet.peer,
                kind=outlet.kind.name.lower(),
                subscriptions=len(outlet.subscriptions),
                queued_messages=outlet.pending_messages,
                queued_bytes=outlet.pending_bytes,
                forwarded_messages=outlet.delivered_messages,
                dropped_messages=outlet.dropped_messages,
            )
            for outlet in outlets
            if outlet.kind is not LinkKind.CLIENT
        ),
    )
