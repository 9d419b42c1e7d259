"""The parts of a consumer spread over several workers (see
broky.durable.consumer_relays, which combines them): which owners a pattern
reaches, one owner's part on its channel, and the bookkeeping of receipts
split over owners. Kept apart so the combining module stays one concern.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs

from broky.durable.consumer_gate import Entry, PartCount, waiting_frame, waiting_runs
from broky.durable.owner_channel import OwnerChannel
from broky.durable.relays import ConsumerFrame
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.frames import (
    Buffer,
    Consume,
    Deliver,
    Error,
    Flow,
    LocatedDeliver,
    Redelivered,
    Settle,
    Settled,
    Subscribed,
    Unsubscribe,
)
from broky.router.matcher import patterns_overlap
from broky.subscriptions.service import SubscriptionService

if TYPE_CHECKING:
    from broky.durable.consumer_relays import SpreadConsumer

#: Size prefix of an encoded frame.
PREFIX_BYTES: Final = 4


def owners_of(service: SubscriptionService, pattern: bytes) -> set[int]:
    """The workers owning partitions of the durable topics ``pattern`` (a
    valid pattern) reaches."""
    store = service.store
    return {
        store.owner_index(topic.name, partition)
        for topic in store.policies.policies
        if patterns_overlap(topic.pattern, pattern)
        for partition in range(topic.partitions)
    }


class DeliveryReader:
    """One part's Redelivered and Deliver frames read as gate entries: each
    Deliver kept whole where it can be (``consumer_gate.waiting_frame``),
    else its runs, with the delivery counts and topic the Redelivered
    frames before it named. One per part: a stream's Redelivered names the
    topic of every Deliver after it."""

    def __init__(self, stream: int) -> None:
        #: The client's consumer stream (what a whole frame is sent on).
        self.stream = stream
        self._counts: list[PartCount] = []
        #: The topic the part's stream last named (Redelivered): its Delivers'.
        self._topic = ""

    def redelivered(self, frame: Redelivered) -> None:
        entries = zip(frame.partitions, frame.offsets, frame.counts, strict=True)
        self._counts.extend((frame.topic, p, o, c) for p, o, c in entries)
        self._topic = frame.topic

    def deliver(self, buf: Buffer) -> list[Entry]:
        """The Deliver frame ``buf`` (the bytes after its size prefix)."""
        entries = self._read(buf)
        if entries is None:
            raise TypeError("a Deliver frame was expected")
        return entries

    def runs(self, frame: Deliver) -> list[Entry]:
        """A decoded Deliver's runs, one entry each."""
        counts, self._counts = self._counts, []
        return list(waiting_runs(frame.runs, counts, self._topic))

    def read(self, frames: Sequence[bytes]) -> list[Entry]:
        """The size-prefixed frames the local subscription service delivered."""
        entries: list[Entry] = []
        for data in frames:
            entries.extend(self._read(memoryview(data)[PREFIX_BYTES:]) or ())
        return entries

    def _read(self, buf: Buffer) -> list[Entry] | None:
        """The entries of frame ``buf`` if it is a Deliver (a Redelivered is
        noted, for the Deliver after it)."""
        whole = waiting_frame(buf, self.stream, self._counts, self._topic)
        if whole is not None:
            self._counts = []
            return [whole]
        frame = decode_frame(buf)
        if isinstance(frame, Deliver):
            return self.runs(frame)
        if isinstance(frame, Redelivered):
            self.redelivered(frame)
        return None


@attrs.define(slots=True, eq=False)
class Receipt:
    """A client's Settle asking for a receipt, split over owners."""

    sequence: int
    waiting: int
    stale: int = 0
    unconfirmed: int = 0


@attrs.frozen(slots=True)
class Share:
    """One owner's share of a receipted settle, awaiting its ``Settled``."""

    receipt: Receipt
    owner: int
    #: Offsets the share names (all unconfirmed if the owner goes down).
    offsets: int


class RemotePart:
    """One owner's part of a spread consumer: a stream of its channel."""

    def __init__(self, consumer: SpreadConsumer, owner: int, channel: OwnerChannel) -> None:
        self.consumer = consumer
        self.owner = owner
        self.channel = channel
        self.stream = channel.new_stream()
        self._reader = DeliveryReader(consumer.stream)

    def send(self, frame: Consume | Settle | Flow | Unsubscribe) -> None:
        self.channel.send(encode_frame(attrs.evolve(frame, stream=self.stream)))

    def receive(self, frame: ConsumerFrame) -> None:
        """A frame the owner sent on this part's stream (the channel's reader)."""
        consumer = self.consumer
        if isinstance(frame, LocatedDeliver):
            consumer.delivered(self.owner, self._reader.deliver(frame.buffer))
        elif isinstance(frame, Redelivered):
            self._reader.redelivered(frame)
        elif isinstance(frame, Deliver):
            # Not laid out as our encoder lays it out (or the channel decoded
            # it: the pure build): its runs one by one.
            consumer.delivered(self.owner, self._reader.runs(frame))
        elif isinstance(frame, Settled):
            consumer.part_settled(frame.sequence, frame.stale, frame.unconfirmed)
        elif isinstance(frame, Subscribed):
            consumer.confirmed(self.owner)
        elif isinstance(frame, Error):
            consumer.part_error(self, frame.code, frame.message)

    def down(self) -> None:
        """The channel went down: the owner died, stalled or is restarting."""
        self.consumer.part_down(self)

    def detach(self) -> None:
        if self.channel.consumer_parts.pop(self.stream, None) is not None:
            self.send(Unsubscribe(self.stream))
