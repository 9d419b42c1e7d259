"""Durable subscriptions consumed from any worker of a node.

Each partition's subscription state lives with the partition's owner worker
(broky.subscriptions). A client may be connected to any worker (the
*ingress*). Its ``Consume`` whose pattern reaches partitions of several
workers becomes a :class:`SpreadConsumer` there, made of one *part* per
owner:

- this worker's own partitions: a consumer of the local subscription
  service attached with ``own_only`` (its frames come back here through
  ``ConsumerAnswers``, not to the connection);
- every other owner: a :class:`RemotePart`, a ``Consume`` on a stream of
  the :class:`~broky.durable.forwarding.OwnerChannel` to that owner, which
  serves it as it serves a client, for its own partitions only.

**Attach, all or nothing.** Every part attaches with no credit, so nothing
is delivered before the client hears ``Subscribed``; that is sent once
every owner confirmed. If one refuses (an exclusive subscription taken, a
kind other than the subscription's, ...) or its channel is down, the
others are detached and the client gets that owner's error.

**Deliveries.** Each owner's ``Redelivered`` and ``Deliver`` frames go
through the consumer's :class:`~broky.durable.consumer_gate.CreditGate` to
the client's stream, each owner's in the order it sent them (a key lives in
one partition, so key-shared order per key holds). The gate keeps the
client's credit window whole and shares it among the parts (its docstring
says the rule). ``max_in_flight`` is split evenly among the parts (at least
one each): an owner only knows what it holds itself.

**Settles.** A ``Settle``'s ranges are split by the owner of their
(topic, partition) and forwarded; a receipt (``Settled``) reaches the
client once every owner involved committed its share, with their stale
counts added up.

**Failure.** When an owner's channel goes down, the whole consumer ends
with ``OwnerUnavailable`` (retriable: consume again). The owner detaches
its part when it sees the channel close (at once), or it was killed: then
its state store still holds what was in flight, and it is redelivered
after its restart as after any crash. When the client leaves (disconnect
or ``Unsubscribe``) every part is detached at once; messages that waited
in the gate are redelivered by their owners.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

from broky.durable.consumer_gate import CreditGate, Waiting
from broky.durable.forwarding import Forwarder, OwnerChannel
from broky.durable.relays import ConsumerFrame
from broky.protocol.chunks import encode_chunk
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.constants import ErrorCode
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
from broky.router.outbox import Outlet
from broky.subscriptions.consumers import ConsumerLink
from broky.subscriptions.delivery import FRAME_SHARE
from broky.subscriptions.service import SubscriptionService

#: Size prefix of an encoded frame.
PREFIX_BYTES = 4


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
class _Receipt:
    """A client's Settle asking for a receipt, split over owners."""

    sequence: int
    waiting: int
    stale: int = 0


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
            consumer.part_settled(frame.sequence, frame.stale)
        elif isinstance(frame, Subscribed):
            consumer.confirmed(self.owner)
        elif isinstance(frame, Error):
            consumer.fail(frame.code, frame.message)

    def down(self) -> None:
        """The channel went down: the owner died, stalled or is restarting."""
        self.consumer.fail(
            ErrorCode.OWNER_UNAVAILABLE,
            f"worker {self.owner}, owner of some partitions of subscription "
            f"{self.consumer.subscription!r}, went down; its unacked messages are "
            "redelivered once it is back: consume again shortly",
        )

    def detach(self) -> None:
        if self.channel.consumer_parts.pop(self.stream, None) is not None:
            self.send(Unsubscribe(self.stream))


class SpreadConsumer:
    """A client's consumer over the partitions of several workers (module docstring).

    Called by the client's connection (``start``, ``settle``, ``grant``,
    ``detach``), by the channels' readers (through its :class:`RemotePart`\\ s)
    and by the local subscription service (as the local part's
    ``ConsumerAnswers``); none of it waits.
    """

    def __init__(
        self,
        frame: Consume,
        outlet: Outlet,
        service: SubscriptionService,
        forwarder: Forwarder,
        owners: set[int],
    ) -> None:
        self.stream = frame.stream
        self.subscription = frame.subscription
        self.outlet = outlet
        self.closed = False
        self.active = False
        self._frame = frame
        self._service = service
        self._forwarder = forwarder
        store = service.store
        self._worker = store.worker
        #: The topic the local part's frames last named (Redelivered).
        self._local_topic = ""
        self._topics = {
            topic.name: topic
            for topic in store.policies.policies
            if patterns_overlap(topic.pattern, frame.pattern)
        }
        self.gate = CreditGate(frame.stream, owners, outlet.max_frame_bytes // FRAME_SHARE)
        self._remote: dict[int, RemotePart] = {}
        self._local: ConsumerLink | None = None
        self._confirmed: set[int] = set()
        self._receipts: dict[int, _Receipt] = {}
        self._sequences = itertools.count(1)

    # --- the client's requests ----------------------------------------------------

    def start(self) -> None:
        """Attach a part on every owner, with no credit (module docstring)."""
        owners = sorted(self.gate.held)
        frame = attrs.evolve(
            self._frame, credit=0, max_in_flight=max(1, self._frame.max_in_flight // len(owners))
        )
        for owner in owners:
            if owner == self._worker:
                continue
            channel = self._forwarder.channels.get(owner)
            if channel is None or not channel.connected:
                self.fail(
                    ErrorCode.OWNER_UNAVAILABLE,
                    f"subscription {self.subscription!r}: worker {owner}, owner of some of "
                    "its partitions, is unavailable (restarting?); consume again shortly",
                )
                return
            part = RemotePart(self, owner, channel)
            self._remote[owner] = part
            channel.consumer_parts[part.stream] = part
            part.send(frame)
        if self._worker in owners:
            link = self._service.consume(frame, self.outlet, own_only=True, answers=self)
            self._local = link
            if self.closed:  # refused at once
                self._service.detach(link)

    def grant(self, credit: int) -> None:
        """The client's ``Flow``."""
        if self.closed:
            return
        self.gate.grant(credit)
        if self.active:
            self._pump()

    def settle(self, frame: Settle) -> None:
        """Split ``frame`` by owner and forward each share (module docstring)."""
        if self.closed:
            return
        topics = self._topics
        name = frame.topic or (next(iter(topics)) if len(topics) == 1 else "")
        topic = topics.get(name)
        if topic is None:
            self._error(
                ErrorCode.UNKNOWN_TOPIC,
                f"settle names topic {frame.topic!r}, which consumer stream {self.stream} "
                f"does not read (it reads {', '.join(sorted(topics))}); nothing settled",
            )
            return
        owner_index = self._service.store.owner_index
        shares: dict[int, list[tuple[int, int, int]]] = {}
        for number, first, last in zip(
            frame.partitions, frame.first_offsets, frame.last_offsets, strict=True
        ):
            if 0 <= number < topic.partitions:
                shares.setdefault(owner_index(name, number), []).append((number, first, last))
        receipt = _Receipt(frame.sequence, len(shares)) if frame.sequence else None
        if receipt is not None and not shares:
            self.outlet.send_control(encode_frame(Settled(self.stream, frame.sequence, 0)))
            return
        for owner, entries in shares.items():
            sequence = 0
            if receipt is not None:
                sequence = next(self._sequences)
                self._receipts[sequence] = receipt
            share = attrs.evolve(
                frame,
                sequence=sequence,
                partitions=tuple(entry[0] for entry in entries),
                first_offsets=tuple(entry[1] for entry in entries),
                last_offsets=tuple(entry[2] for entry in entries),
                topic=name,
            )
            if owner == self._worker and self._local is not None:
                self._service.settle(self._local, share)
            elif owner in self._remote:
                self._remote[owner].send(share)

    def detach(self) -> None:
        """The client closed the consumer or left: detach every part at once."""
        if self.closed:
            return
        self.closed = True
        for part in self._remote.values():
            part.detach()
        if self._local is not None:
            self._service.detach(self._local)
        self._receipts.clear()

    # --- the parts' answers -------------------------------------------------------

    def confirmed(self, owner: int) -> None:
        """``owner`` attached its part: once all did, the client is told."""
        if self.closed or self.active:
            return
        self._confirmed.add(owner)
        if len(self._confirmed) == len(self.gate.held):
            self.active = True
            self.outlet.send_control(encode_frame(Subscribed(self.stream)))
            self.gate.grant(self._frame.credit)
            self._pump()

    def delivered(self, owner: int, runs: list[Waiting]) -> None:
        """``owner`` delivered ``runs``: on to the client as its window allows."""
        if self.closed:
            return
        self.gate.arrive(owner, runs)
        self._pump()

    def part_settled(self, sequence: int, stale: int) -> None:
        """An owner committed its share of a receipted settle."""
        receipt = self._receipts.pop(sequence, None)
        if receipt is None or self.closed:
            return
        receipt.stale += stale
        receipt.waiting -= 1
        if not receipt.waiting:
            self.outlet.send_control(
                encode_frame(Settled(self.stream, receipt.sequence, receipt.stale))
            )

    def fail(self, code: ErrorCode, message: str) -> None:
        """A part was refused, evicted or lost: the whole consumer ends."""
        if self.closed:
            return
        self.detach()
        self._error(code, message)

    def _error(self, code: ErrorCode, message: str) -> None:
        self.outlet.send_control(encode_frame(Error(code, message, self.stream)))

    def _pump(self) -> None:
        frames = self.gate.take()
        if frames:
            self.outlet.send_control(b"".join(frames))
        for owner, credit in self.gate.shares().items():
            if owner == self._worker:
                if self._local is not None:
                    self._service.grant(self._local, credit)
            else:
                self._remote[owner].send(Flow(0, credit))

    # --- the local part's answers (ConsumerAnswers) --------------------------------

    def subscribed(self) -> None:
        self.confirmed(self._worker)

    def failed(self, code: ErrorCode, message: str) -> None:
        self.fail(code, message)

    def settled(self, sequence: int, stale: int) -> None:
        self.part_settled(sequence, stale)

    def delivered_frames(self, frames: Sequence[bytes]) -> None:
        counts: list[tuple[str, int, int, int]] = []
        runs: list[Waiting] = []
        for data in frames:
            frame = decode_frame(memoryview(data)[PREFIX_BYTES:])
            if isinstance(frame, Redelivered):
                entries = zip(frame.partitions, frame.offsets, frame.counts, strict=True)
                counts.extend((frame.topic, p, o, c) for p, o, c in entries)
                self._local_topic = frame.topic
            elif isinstance(frame, Deliver):
                runs.extend(waiting_runs(frame.runs, counts, self._local_topic))
                counts = []
        self.delivered(self._worker, runs)
