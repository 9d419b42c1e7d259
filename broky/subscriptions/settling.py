"""Applying a consumer's ``Settle`` to the partitions it names.

A Settle names one topic and ranges of offsets per partition; each touched
partition's dispatcher applies its kind (ack, nack, term, in progress), and
a ``Settled`` receipt, when asked for, waits until every touched
partition's state store committed it. Why its own module: this is the one
path from a Settle frame to the dispatchers, and it reads the service's
partitions and counters without owning any of them (the service, which
does, calls :func:`apply_settle`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING

import trio

from broky.protocol.constants import ErrorCode, SettleKind
from broky.protocol.frames import Settle
from broky.subscriptions.consumers import ConsumerLink, SubscriptionCounters
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.settle_ranges import gather_ranges
from broky.subscriptions.tracker import AckTracker

if TYPE_CHECKING:
    from broky.subscriptions.partition import PartitionSubscriptions
    from broky.subscriptions.service import SubscriptionService


def apply_settle(service: SubscriptionService, link: ConsumerLink, frame: Settle) -> None:
    """Apply ``frame`` from ``link``'s consumer; a ``Settled`` follows once it
    is committed if asked. A topic the consumer does not read is answered
    with a stream error and settles nothing."""
    topics = {topic for topic, _ in link.partitions}
    topic = frame.topic or (next(iter(topics)) if len(topics) == 1 else "")
    if topic not in topics:
        link.error(
            ErrorCode.UNKNOWN_TOPIC,
            f"settle names topic {frame.topic!r}, which consumer stream {link.stream} "
            f"does not read (it reads {', '.join(sorted(topics))}); nothing settled",
        )
        return
    now = trio.current_time()
    stale = 0
    name = link.subscription
    spans, unconfirmed = gather_ranges(
        frame, lambda number: _settled_tracker(service, link, topic, number)
    )
    touched = {number: service.partitions[topic, number] for number in spans}
    counters = service.counters(name)
    for number, partition in touched.items():
        ranges = spans[number]
        count = sum(map(len, ranges))  # C-speed: a range per acked run or two
        dispatcher = partition.dispatchers[name]
        stale += _apply(dispatcher, counters, link, frame, ranges, count, now)
        # A nack's redelivery waits for the commit of its count: commit at once.
        partition.changed(
            name,
            count if frame.kind is SettleKind.ACK else 0,
            hurry=frame.kind is SettleKind.NACK,
        )
    service.pump(link)
    if frame.sequence:
        _receipt(link, frame.sequence, stale, unconfirmed, list(touched.values()))


def _settled_tracker(
    service: SubscriptionService, link: ConsumerLink, topic: str, number: int
) -> AckTracker | None:
    """The tracker a settle of ``link`` names with partition ``number`` of
    ``topic`` reaches, or None when that is not one of its partitions."""
    partition = service.partitions.get((topic, number))
    dispatcher = partition.dispatchers.get(link.subscription) if partition else None
    if dispatcher is None or (topic, number) not in link.partitions:
        return None
    return dispatcher.tracker


def _apply(
    dispatcher: Dispatcher,
    counters: SubscriptionCounters,
    link: ConsumerLink,
    frame: Settle,
    ranges: list[Sequence[int]],
    count: int,
    now: float,
) -> int:
    """Apply ``frame``'s kind to the offsets of ``ranges`` (``count`` of
    them) of one dispatcher."""
    kind = frame.kind
    if kind is SettleKind.ACK:
        stale = dispatcher.ack_ranges(link.id, ranges, now)
        counters.acked += count
        counters.stale_acks += stale
        return stale
    offsets = chain.from_iterable(ranges)
    if kind is SettleKind.NACK:
        delay = None if frame.delay_ms < 0 else frame.delay_ms / 1000
        dispatcher.nack(link.id, offsets, now, delay, frame.reason)
    elif kind is SettleKind.TERM:
        dispatcher.term(link.id, offsets, now, frame.reason or "terminated by the consumer")
    else:
        dispatcher.in_progress(link.id, offsets, now)
    return 0


def _receipt(
    link: ConsumerLink,
    sequence: int,
    stale: int,
    unconfirmed: int,
    partitions: list[PartitionSubscriptions],
) -> None:
    """Send ``Settled`` once every touched partition committed."""
    waiting = len(partitions)
    if not waiting:
        link.settled(sequence, stale, unconfirmed)
        return

    def one_committed() -> None:
        nonlocal waiting
        waiting -= 1
        if not waiting:
            link.settled(sequence, stale, unconfirmed)

    for partition in partitions:
        partition.committer.after_commit(one_committed)
