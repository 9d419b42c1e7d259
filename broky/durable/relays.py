"""The consuming side of forwarding: a client subscription's share served by
another worker (a *relay*), and a ListPartitions answered by several workers.

Sans-IO: the owner channel (broky.durable.owner_channel) feeds what arrives and
sends the Flow frames these compute.

Credit: the owner may send a relay ``in_flight`` messages. Until the first
runs show the message size that is RELAY_START_CREDIT; then the window is
what fits in the lower half of the client's outbox, by messages and by
bytes, at most RELAY_MAX_CREDIT. Received runs enter the outbox only while
it is at most half full (the ingress's own replay reads only then too and
adds at most a quarter), the rest wait here, in order, bounded by the
window: nothing the owners send can overflow the client's outbox.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import attrs

from broky.durable.replay import queue_live
from broky.protocol.chunks import encode_chunk
from broky.protocol.constants import ErrorCode, SlowConsumerPolicy
from broky.protocol.frames import (
    DeletedSubscription,
    Deliver,
    EncodedRun,
    Error,
    LocatedDeliver,
    Redelivered,
    Run,
    Settled,
    Subscribed,
)
from broky.router.matcher import patterns_overlap
from broky.router.outbox import Subscription
from broky.storage.topics import TopicPolicy

#: Messages an owner may send a relay before the ingress has seen their size
#: (8 of the largest messages a default frame holds fit a default outbox).
RELAY_START_CREDIT: Final = 8
#: Most messages in flight per relay, however small they are.
RELAY_MAX_CREDIT: Final = 8192

#: What an owner sends on a relayed consumer's stream (or a relayed
#: subscription deletion's, broky.durable.subscription_deletes); a durable
#: Deliver comes as a ``LocatedDeliver``, left in the frame, where the
#: compiled chunk reader is built.
ConsumerFrame = (
    Deliver | LocatedDeliver | Redelivered | Settled | Subscribed | Error | DeletedSubscription
)


class ChannelConsumer(Protocol):
    """A relayed consumer's part on an owner channel (broky.durable.consumer_relays)."""

    def receive(self, frame: ConsumerFrame) -> None: ...

    def down(self) -> None: ...


#: One ListPartitions entry: topic, partition, start offset, end offset.
PartitionEntry = tuple[str, int, int, int]


@attrs.define(slots=True, eq=False)
class Relay:
    """A client subscription's share served by one owner (module docstring)."""

    subscription: Subscription
    #: Credit the owner holds (messages it may still send).
    in_flight: int = RELAY_START_CREDIT
    #: Bytes per message of what the owner sent lately (0: nothing yet).
    message_bytes: int = 0
    #: Runs received that do not fit the client's outbox yet.
    waiting: deque[EncodedRun] = attrs.field(factory=deque)
    waiting_bytes: int = 0
    waiting_messages: int = 0

    def receive(self, runs: Sequence[Run]) -> None:
        """Runs the owner delivered (each with its partition and offsets)."""
        count = size = 0
        for run in runs:
            chunk = encode_chunk(run)
            self.waiting.append(EncodedRun(run.key, run.count, chunk))
            count += run.count
            size += len(chunk)
        self.waiting_bytes += size
        self.waiting_messages += count
        self.in_flight -= count
        if count:
            self.message_bytes = max(1, size // count)

    def push_waiting(self) -> None:
        """Move waiting runs into the client's outbox while it is at most half full."""
        subscription = self.subscription
        outlet = subscription.outlet
        waiting = self.waiting
        while waiting:
            run = waiting[0]
            size = len(run.chunk)
            if (
                subscription.pending_bytes * 2 > subscription.max_bytes
                or subscription.pending_messages * 2 > subscription.max_messages
                or subscription.pending_messages + run.count > subscription.max_messages
                or subscription.pending_bytes + size > subscription.max_bytes
                or (
                    outlet.max_pending_bytes
                    and outlet.pending_bytes
                    and outlet.pending_bytes + size > outlet.max_pending_bytes
                )
            ):
                return
            waiting.popleft()
            self.waiting_bytes -= size
            self.waiting_messages -= run.count
            # Past any holding area: that one serves the seam of this worker's
            # own partitions; the owner kept the seam of these.
            queue_live(subscription, run)

    def grant(self) -> int:
        """Push what fits, then the credit to give the owner (0: none now)."""
        self.push_waiting()
        if not self.message_bytes:
            return 0
        subscription = self.subscription
        room_bytes = subscription.max_bytes // 2 - subscription.pending_bytes - self.waiting_bytes
        room_messages = (
            subscription.max_messages // 2 - subscription.pending_messages - self.waiting_messages
        )
        window = min(RELAY_MAX_CREDIT, room_messages, room_bytes // self.message_bytes)
        if window <= self.in_flight:
            return 0
        credit = window - self.in_flight
        self.in_flight = window
        return credit

    def dropped(self, count: int) -> None:
        """The owner dropped ``count`` messages (it fell behind live traffic):
        the client's policy decides, as on one worker."""
        subscription = self.subscription
        outlet = subscription.outlet
        if subscription.policy is SlowConsumerPolicy.DISCONNECT:
            outlet.fail(
                ErrorCode.SLOW_CONSUMER,
                f"subscription {subscription.stream} fell behind by more than "
                f"{subscription.max_messages} messages or {subscription.max_bytes} bytes",
            )
            return
        subscription.unreported_drops += count
        subscription.dropped_messages += count
        outlet.counters.dropped_slow_consumer += count
        if not subscription.scheduled:
            subscription.scheduled = True  # the Notice goes out promptly
            outlet.schedule(subscription)


class PartitionListing:
    """A ListPartitions answered by several workers: merged once all answered."""

    def __init__(self, expected: int, done: Callable[[list[PartitionEntry] | str], None]) -> None:
        self.expected = expected
        self.entries: list[PartitionEntry] = []
        self.failure = ""
        self._done = done
        self._finished = False

    def add(self, entries: list[PartitionEntry]) -> None:
        self.entries.extend(entries)
        self._answered()

    def fail(self, reason: str) -> None:
        self.failure = self.failure or reason
        self._answered()

    def _answered(self) -> None:
        self.expected -= 1
        if self.expected <= 0 and not self._finished:
            self._finished = True
            self._done(self.failure or self.entries)


def overlapping_owners(
    policies: tuple[TopicPolicy, ...],
    pattern: bytes,
    owner_index: Callable[[str, int], int],
    worker: int,
) -> set[int]:
    """The other workers owning partitions of the durable topics ``pattern`` overlaps."""
    owners: set[int] = set()
    for topic in policies:
        if patterns_overlap(topic.pattern, pattern):
            for partition in range(topic.partitions):
                owners.add(owner_index(topic.name, partition))
    owners.discard(worker)
    return owners
