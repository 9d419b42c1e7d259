"""A router's live counters, and snapshots of its state and counters for metrics and ``$SYS``."""

from __future__ import annotations

import attrs

from broky.observability.topics import TopicFigures


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
