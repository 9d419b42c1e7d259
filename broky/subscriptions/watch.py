"""What each durable subscription is doing, and advisories when it goes wrong.

A stall is never silent (JetStream stops at MaxAckPending with no word,
nats-server #4112): four times a second the watch looks at every
subscription of the worker, and one that has messages waiting but delivered
nothing for a second, for one of the reasons below, raises
``$SYS.events.subscription.stalled``, and ``subscription.resumed`` once it
delivers again. Reasons:

- ``max_in_flight``: every consumer holds its ``max_in_flight`` unacked;
- ``no_credit``: every consumer used up the credit it granted;
- ``max_unacked``: the subscription holds 100,000 unacked messages in a
  partition (the dispatcher stops reading new ones);
- ``ack_ranges_full``: acks are so scattered that the dispatcher stops
  reading new offsets until holes fill (ack state is never dropped).

Also advised: ``subscription.redelivery_storm`` (over 10 s, redeliveries
exceed 20 % of deliveries, at least 20 of them), ``subscription.dead_lettered``
(one per message), ``subscription.consumer_evicted`` and
``subscription.deleted`` (one per worker that deleted its share). The same figures
feed the Prometheus families and the ``/subscriptions`` listing
(``statuses``).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from broky.durable.acks import AckTicket
from broky.subscriptions.consumers import ConsumerLink
from broky.subscriptions.model import DeadLetter

if TYPE_CHECKING:
    from collections.abc import Callable

    from broky.subscriptions.partition import PartitionSubscriptions
    from broky.subscriptions.service import SubscriptionService

#: Seconds between two looks at the subscriptions.
CHECK_SECONDS: Final = 0.25
#: A stall this long (seconds) is advised: shorter ones are ordinary
#: moments of a busy consumer at its limit.
STALL_DEBOUNCE: Final = 1.0
#: The redelivery-storm window (seconds), share and minimum count.
STORM_WINDOW: Final = 10.0
STORM_SHARE: Final = 0.2
STORM_MIN_REDELIVERIES: Final = 20

STALLED = "subscription.stalled"
RESUMED = "subscription.resumed"
REDELIVERY_STORM = "subscription.redelivery_storm"
DEAD_LETTERED = "subscription.dead_lettered"
CONSUMER_EVICTED = "subscription.consumer_evicted"
DELETED = "subscription.deleted"
#: Every advisory kind this module raises (``$SYS.events.<kind>``).
KINDS: Final = (STALLED, RESUMED, REDELIVERY_STORM, DEAD_LETTERED, CONSUMER_EVICTED, DELETED)


@attrs.frozen(slots=True)
class SubscriptionStatus:
    """One subscription on one worker (see ``docs/protocol.md``, "Listing")."""

    name: str
    type: str
    pattern: str
    partitions: int
    consumers: int
    #: Messages not acked yet, up to the end of the logs (the lag).
    backlog: int
    #: Delivered and not acked yet.
    in_flight: int
    #: Why it cannot deliver ("" when it can), see the module docstring.
    stalled: str
    delivered: int
    redelivered: int
    acked: int
    stale_acks: int
    dead_lettered: int
    evicted: int
    lost_to_retention: int


@attrs.define(slots=True)
class _Episode:
    """What the watch remembers of one subscription between looks."""

    reason: str = ""
    since: float = 0.0
    advised: bool = False
    storming: bool = False
    #: The subscription's deliveries at the last look: any since is progress.
    delivered: int = 0
    samples: deque[tuple[float, int, int]] = attrs.field(factory=deque)


class Watch:
    """See the module docstring."""

    def __init__(
        self,
        service: SubscriptionService,
        advise: Callable[[str, dict[str, Any]], None] | None,
    ) -> None:
        self._service = service
        self._advise = advise
        self._episodes: dict[str, _Episode] = {}

    def advise(self, kind: str, payload: dict[str, Any]) -> None:
        if self._advise is not None:
            self._advise(kind, payload)

    async def run(self) -> None:
        while True:
            await trio.sleep(CHECK_SECONDS)
            self.check(trio.current_time())

    def _by_name(self) -> dict[str, list[PartitionSubscriptions]]:
        found: dict[str, list[PartitionSubscriptions]] = {}
        for partition in self._service.partitions.values():
            for name in partition.dispatchers:
                found.setdefault(name, []).append(partition)
        return found

    def statuses(self) -> list[SubscriptionStatus]:
        statuses = []
        for name, partitions in sorted(self._by_name().items()):
            dispatchers = [p.dispatchers[name] for p in partitions]
            definition = partitions[0].definitions[name]
            counters = self._service.counters(name)
            consumers = {c for d in dispatchers for c in d.consumers}
            episode = self._episodes.get(name)
            statuses.append(
                SubscriptionStatus(
                    name=name,
                    type=definition.options.type.value,
                    pattern=definition.pattern.decode(errors="replace"),
                    partitions=len(partitions),
                    consumers=len(consumers),
                    backlog=sum(p.backlog(name) for p in partitions),
                    in_flight=sum(len(d.tracker.pending) for d in dispatchers),
                    stalled=episode.reason if episode is not None and episode.advised else "",
                    delivered=counters.delivered,
                    redelivered=counters.redelivered,
                    acked=counters.acked,
                    stale_acks=counters.stale_acks,
                    dead_lettered=counters.dead_lettered,
                    evicted=counters.evicted,
                    lost_to_retention=counters.lost_to_retention,
                )
            )
        return statuses

    def _stall_reason(self, name: str, partitions: list[PartitionSubscriptions]) -> str:
        dispatchers = [p.dispatchers[name] for p in partitions]
        waiting = sum(p.backlog(name) for p in partitions) - sum(
            len(d.tracker.pending) for d in dispatchers
        )
        states = {c.id: c for d in dispatchers for c in d.consumers.values()}
        if waiting <= 0 or not states:
            return ""
        if all(state.room <= 0 for state in states.values()):
            if all(state.in_flight >= state.max_in_flight for state in states.values()):
                return "max_in_flight"
            return "no_credit"
        for partition, dispatcher in zip(partitions, dispatchers, strict=True):
            tracker = dispatcher.tracker
            options = dispatcher.options
            unread = tracker.read_position < partition.owner.end_offset
            if unread and tracker.read_position - tracker.cursor >= options.max_unacked:
                return "max_unacked"
            if unread and len(tracker.acked) >= options.max_ack_ranges:
                return "ack_ranges_full"
        return ""

    def check(self, now: float) -> None:
        by_name = self._by_name()
        for name in set(self._episodes) - set(by_name):
            del self._episodes[name]
        for name, partitions in by_name.items():
            episode = self._episodes.setdefault(name, _Episode())
            delivered = self._service.counters(name).delivered
            progressed, episode.delivered = delivered != episode.delivered, delivered
            reason = "" if progressed else self._stall_reason(name, partitions)
            if reason != episode.reason:
                if episode.advised:
                    self.advise(RESUMED, {"subscription": name, "reason": episode.reason})
                episode.reason, episode.since, episode.advised = reason, now, False
            elif reason and not episode.advised and now - episode.since >= STALL_DEBOUNCE:
                episode.advised = True
                dispatchers = [p.dispatchers[name] for p in partitions]
                self.advise(
                    STALLED,
                    {
                        "subscription": name,
                        "reason": reason,
                        "since_seconds": round(now - episode.since, 3),
                        "consumers": len({c for d in dispatchers for c in d.consumers}),
                        "backlog": sum(p.backlog(name) for p in partitions),
                        "partitions": [f"{p.topic}/{p.partition}" for p in partitions],
                    },
                )
            self._check_storm(name, episode, now)

    def _check_storm(self, name: str, episode: _Episode, now: float) -> None:
        counters = self._service.counters(name)
        samples = episode.samples
        samples.append((now, counters.delivered, counters.redelivered))
        while samples and samples[0][0] < now - STORM_WINDOW:
            samples.popleft()
        _, delivered, redelivered = samples[0]
        redeliveries = counters.redelivered - redelivered
        deliveries = counters.delivered - delivered
        storming = (
            redeliveries >= STORM_MIN_REDELIVERIES and redeliveries > STORM_SHARE * deliveries
        )
        if storming and not episode.storming:
            self.advise(
                REDELIVERY_STORM,
                {
                    "subscription": name,
                    "window_seconds": STORM_WINDOW,
                    "deliveries": deliveries,
                    "redeliveries": redeliveries,
                },
            )
        episode.storming = storming

    def dead_lettered(
        self, partition: PartitionSubscriptions, name: str, event: DeadLetter, ticket: AckTicket
    ) -> None:
        entries = ticket.entries
        self.advise(
            DEAD_LETTERED,
            {
                "subscription": name,
                "topic": partition.topic,
                "partition": partition.partition,
                "offset": event.offset,
                "deliveries": event.count,
                "error": event.error,
                "dead_letter_partition": entries[0][1] if entries else -1,
                "dead_letter_offset": entries[0][2] if entries else -1,
            },
        )

    def deleted(self, name: str, partitions: int, consumers: int) -> None:
        """This worker deleted its share of ``name`` (one advisory per worker)."""
        self.advise(
            DELETED,
            {"subscription": name, "partitions": partitions, "consumers_ended": consumers},
        )

    def evicted(self, link: ConsumerLink, message: str) -> None:
        self.advise(
            CONSUMER_EVICTED,
            {"subscription": link.subscription, "stream": link.stream, "detail": message},
        )
