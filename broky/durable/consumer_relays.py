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
  the :class:`~broky.durable.owner_channel.OwnerChannel` to that owner, which
  serves it as it serves a client, for its own partitions only.

**Attach, all or nothing.** Every part attaches with no credit, so nothing
is delivered before the client hears ``Subscribed``; that is sent once
every owner confirmed. If one refuses (an exclusive subscription taken, a
kind other than the subscription's, ...), the others are detached and the
client gets that owner's error. An owner that is down, or dies while the
consumer attaches, is not a refusal: its part is sent again as after a
failure (below), within the same ``REATTACH_SECONDS``, and the client hears
``Subscribed`` once it is back (or ``OwnerUnavailable`` at the deadline).

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

**Failure.** When an owner's channel goes down once the consumer is
attached, the consumer lives on with the other parts and re-attaches that
owner's part by itself: it polls the channel (it reconnects within 0.25 s
of the owner's return) and sends the ``Consume`` again, retrying on
refusals (the restarted owner not serving yet, an exclusive subscription
whose old part a merely stalled owner has not detached yet), for at most
``REATTACH_SECONDS``; only then does the consumer end, with
``OwnerUnavailable`` or the last refusal. Meanwhile the runs of that owner
that waited in the gate are dropped and its credit forgotten (the owner
redelivers what it had not seen acked: it detached its part when the
channel closed, or it was killed and restarts from its state store),
settles for it are not sent (acks the owner never saw come back as
redeliveries), and receipts awaited from it are answered with those
offsets counted as ``unconfirmed`` (``Settled``): the client learns which
acks may not hold. When the client leaves (disconnect
or ``Unsubscribe``) every part is detached at once; messages that waited in
the gate are redelivered by their owners.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from functools import partial
from typing import Final

import attrs
import trio

from broky.durable.consumer_gate import CreditGate, Entry
from broky.durable.consumer_parts import DeliveryReader, Receipt, RemotePart, Share
from broky.durable.forwarding import Forwarder
from broky.durable.owner_channel import OwnerChannel
from broky.protocol.codec import encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import (
    Consume,
    Error,
    Flow,
    Settle,
    Settled,
    Subscribed,
)
from broky.router.matcher import patterns_overlap
from broky.router.outbox import Outlet
from broky.subscriptions.consumers import ConsumerLink
from broky.subscriptions.delivery import FRAME_SHARE
from broky.subscriptions.service import SubscriptionService

log = logging.getLogger("broky.subscriptions")

#: Seconds a spread consumer waits for a lost owner to come back before it
#: ends with OwnerUnavailable: a supervised worker restarts and loads its
#: subscriptions within a few seconds, even on a loaded machine.
REATTACH_SECONDS: Final = 15.0
#: Seconds between re-attach attempts (the channel's own reconnect backoff
#: is at most 0.25 s).
REATTACH_POLL: Final = 0.1
#: Refusals of a first attach that a restarting owner gives before it
#: serves: retried as a re-attach is.
UNREADY: Final = frozenset(
    (ErrorCode.OWNER_UNAVAILABLE, ErrorCode.SERVER_SHUTDOWN, ErrorCode.STORAGE_FAILURE)
)
#: Refusals of a re-attach that a restarting owner gives before it serves,
#: and ``SubscriptionRefused``: an owner that only stalled may not have
#: detached the old part of an exclusive subscription yet. Retried until
#: the deadline, which then ends the consumer with the last refusal.
RETRIABLE: Final = UNREADY | {ErrorCode.SUBSCRIPTION_REFUSED}


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
        #: The local part's frames, read as the gate's entries.
        self._local_reader = DeliveryReader(frame.stream)
        self._topics = {
            topic.name: topic
            for topic in store.policies.policies
            if patterns_overlap(topic.pattern, frame.pattern)
        }
        #: The owner of each partition of each topic read: a settle looks up
        #: one per range, and key-shared acks come in ranges of a message or two.
        self._partition_owners = {
            name: tuple(store.owner_index(name, number) for number in range(topic.partitions))
            for name, topic in self._topics.items()
        }
        self.gate = CreditGate(frame.stream, owners, outlet.max_frame_bytes // FRAME_SHARE)
        #: Every owner: ``Subscribed`` waits for each (the gate forgets lost ones).
        self._owners = frozenset(owners)
        self._remote: dict[int, RemotePart] = {}
        self._local: ConsumerLink | None = None
        self._confirmed: set[int] = set()
        self._receipts: dict[int, Share] = {}
        self._sequences = itertools.count(1)
        #: What each part attaches with (no credit, its max_in_flight share).
        self._part_frame = frame
        #: Owners lost after the attach, with the time to give up on them.
        self._lost: dict[int, float] = {}
        #: Owners whose part was sent again and is not confirmed yet.
        self._reattaching: set[int] = set()
        #: The last refusal of each lost owner's re-attach (ends it at the deadline).
        self._refusals: dict[int, tuple[ErrorCode, str]] = {}

    # --- the client's requests ----------------------------------------------------

    def start(self) -> None:
        """Attach a part on every owner, with no credit (module docstring)."""
        owners = sorted(self._owners)
        frame = self._part_frame = attrs.evolve(
            self._frame, credit=0, max_in_flight=max(1, self._frame.max_in_flight // len(owners))
        )
        for owner in owners:
            if owner == self._worker:
                continue
            channel = self._forwarder.channels.get(owner)
            if channel is None or not channel.connected:
                self._lose(owner)  # restarting: attached once it is back
                if self.closed:
                    return
                continue
            self._attach_part(owner, channel)
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
        owners = self._partition_owners[name]
        shares: dict[int, list[tuple[int, int, int]]] = {}
        for number, first, last in zip(
            frame.partitions, frame.first_offsets, frame.last_offsets, strict=True
        ):
            if 0 <= number < len(owners):
                shares.setdefault(owners[number], []).append((number, first, last))
        receipt = Receipt(frame.sequence, len(shares)) if frame.sequence else None
        if receipt is not None and not shares:
            self.outlet.send_control(encode_frame(Settled(self.stream, frame.sequence, 0)))
            return
        for owner, entries in shares.items():
            offsets = sum(last + 1 - first for _, first, last in entries)
            if owner in self._lost:
                # Not sent: the owner is back with what it had committed, and
                # redelivers the rest; a receipt counts these as unconfirmed.
                if receipt is not None:
                    self._answer(receipt, 0, offsets)
                continue
            sequence = 0
            if receipt is not None:
                sequence = next(self._sequences)
                self._receipts[sequence] = Share(receipt, owner, offsets)
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
        if self.closed:
            return
        if owner in self._reattaching:
            self._reattaching.discard(owner)
            del self._lost[owner]
            self._refusals.pop(owner, None)
            self.gate.held[owner] = 0
            log.info(
                "consumer of %r: worker %d is back, its part %sattached",
                self.subscription,
                owner,
                "re-" if self.active else "",
            )
            if self.active:
                self._pump()
                return
        if self.active:
            return
        self._confirmed.add(owner)
        if self._confirmed == self._owners:
            self.active = True
            self.outlet.send_control(encode_frame(Subscribed(self.stream)))
            self.gate.grant(self._frame.credit)
            self._pump()

    def delivered(self, owner: int, runs: list[Entry]) -> None:
        """``owner`` delivered ``runs``: on to the client as its window allows."""
        if self.closed:
            return
        self.gate.arrive(owner, runs)
        self._pump()

    def part_settled(self, sequence: int, stale: int, unconfirmed: int = 0) -> None:
        """An owner committed its share of a receipted settle."""
        share = self._receipts.pop(sequence, None)
        if share is None or self.closed:
            return
        self._answer(share.receipt, stale, unconfirmed)

    def _answer(self, receipt: Receipt, stale: int, unconfirmed: int) -> None:
        """One owner's share of ``receipt`` is answered; the last sends it."""
        receipt.stale += stale
        receipt.unconfirmed += unconfirmed
        receipt.waiting -= 1
        if not receipt.waiting:
            self.outlet.send_control(
                encode_frame(
                    Settled(self.stream, receipt.sequence, receipt.stale, receipt.unconfirmed)
                )
            )

    # --- a lost owner ---------------------------------------------------------------

    def _attach_part(self, owner: int, channel: OwnerChannel) -> None:
        part = RemotePart(self, owner, channel)
        self._remote[owner] = part
        channel.consumer_parts[part.stream] = part
        part.send(self._part_frame)

    def part_down(self, part: RemotePart) -> None:
        """``part``'s channel went down (module docstring, "Failure")."""
        owner = part.owner
        if self.closed or self._remote.get(owner) is not part:
            return
        self._lose(owner)

    def part_error(self, part: RemotePart, code: ErrorCode, message: str) -> None:
        """``part``'s owner refused or ended it: retried if it is an attach
        or re-attach the owner is not ready for, else the consumer ends."""
        owner = part.owner
        retriable: frozenset[ErrorCode] = frozenset()
        if owner in self._reattaching:
            retriable = RETRIABLE
        elif not self.active:
            retriable = UNREADY
        if self._remote.get(owner) is part and code in retriable:
            part.channel.consumer_parts.pop(part.stream, None)
            self._refusals[owner] = (code, message)
            self._lose(owner)
            return
        self.fail(code, message)

    def _lose(self, owner: int) -> None:
        self._remote.pop(owner, None)
        self._reattaching.discard(owner)
        if owner not in self._lost:
            self._lost[owner] = trio.current_time() + REATTACH_SECONDS
            self.gate.drop(owner)
            for sequence, share in list(self._receipts.items()):
                if share.owner == owner:
                    del self._receipts[sequence]
                    self._answer(share.receipt, 0, share.offsets)
            log.warning(
                "consumer of %r: worker %d went down; re-attaching its part",
                self.subscription,
                owner,
            )
        if not self._service.start_soon(partial(self._reattach, owner)):
            self.fail(ErrorCode.SERVER_SHUTDOWN, "the broker is shutting down")

    async def _reattach(self, owner: int) -> None:
        """Send ``owner``'s part again once its channel is up; give up at its deadline."""
        while not self.closed and owner in self._lost and owner not in self._remote:
            await trio.sleep(REATTACH_POLL)
            if self.closed or owner not in self._lost or owner in self._remote:
                return
            if trio.current_time() >= self._lost[owner]:
                code, message = self._refusals.get(owner) or (
                    ErrorCode.OWNER_UNAVAILABLE,
                    f"worker {owner}, owner of some partitions of subscription "
                    f"{self.subscription!r}, did not come back within {REATTACH_SECONDS:g} s; "
                    "its unacked messages are redelivered once it is back: consume again",
                )
                self.fail(code, message)
                return
            channel = self._forwarder.channels.get(owner)
            if channel is not None and channel.connected:
                self._reattaching.add(owner)
                self._attach_part(owner, channel)
                return

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

    def settled(self, sequence: int, stale: int, unconfirmed: int) -> None:
        self.part_settled(sequence, stale, unconfirmed)

    def delivered_frames(self, frames: Sequence[bytes]) -> None:
        self.delivered(self._worker, self._local_reader.read(frames))
