"""The parts of a consumer spread over several workers (see
broky.durable.consumer_relays, which combines them): which owners a pattern
reaches, one owner's part on its channel, and the bookkeeping of receipts
split over owners. Kept apart so the combining module stays one concern.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from broky.durable.consumer_gate import Waiting
from broky.durable.owner_channel import OwnerChannel
from broky.durable.relays import ConsumerFrame
from broky.protocol.chunks import encode_chunk
from broky.protocol.codec import encode_frame
from broky.protocol.frames import (
    Consume,
    Deliver,
    Error,
    Flow,
    Redelivered,
    Run,
    Settle,
    Settled,
    Subscribed,
    Unsubscribe,
)
from broky.router.matcher import patterns_overlap
from broky.subscriptions.service import SubscriptionService

if TYPE_CHECKING:
    from broky.durable.consumer_relays import SpreadConsumer


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


def waiting_runs(
    runs: Sequence[Run], counts: list[tuple[str, int, int, int]], topic: str
) -> list[Waiting]:
    """``runs`` of a Deliver of ``topic`` (the one the part's stream last
    named) as gate entries, each with the delivery counts (``(topic,
    partition, offset, count)`` from the Redelivered before it) of its
    messages."""
    found = []
    for run in runs:
        stop = run.base_offset + run.count
        mine = [
            (topic, offset, count)
            for topic, partition, offset, count in counts
            if partition == run.partition and run.base_offset <= offset < stop
        ]
        found.append(
            Waiting(encode_chunk(run), run.count, run.partition, run.base_offset, mine, topic)
        )
    return found


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
        self._counts: list[tuple[str, int, int, int]] = []
        #: The topic this part's stream last named (Redelivered): its Delivers'.
        self._topic = ""

    def send(self, frame: Consume | Settle | Flow | Unsubscribe) -> None:
        self.channel.send(encode_frame(attrs.evolve(frame, stream=self.stream)))

    def receive(self, frame: ConsumerFrame) -> None:
        """A frame the owner sent on this part's stream (the channel's reader)."""
        consumer = self.consumer
        if isinstance(frame, Redelivered):
            entries = zip(frame.partitions, frame.offsets, frame.counts, strict=True)
            self._counts.extend((frame.topic, p, o, c) for p, o, c in entries)
            self._topic = frame.topic
        elif isinstance(frame, Deliver):
            counts, self._counts = self._counts, []
            consumer.delivered(self.owner, waiting_runs(frame.runs, counts, self._topic))
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
