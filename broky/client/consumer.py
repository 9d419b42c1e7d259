"""Durable-subscription consumers: ``async with client.consumer(...) as c``.

A ``Consumer`` is one consumer attached (``Consume`` frame) to a named
subscription. The client's reader task hands it delivered runs and the
broker's ``Redelivered`` and ``Settled`` frames; the application's task
iterates ``Delivery`` objects and settles each one (``ack``, ``nack``,
``term``, ``in_progress``). Settles are not sent one by one: a
``SettleBatcher`` (``settling.py``) folds them into offset ranges, sent by
a timer task every ``ack_interval`` seconds, at once when ``ack_batch``
outcomes are pending, on ``flush`` and on close. ``flush`` also waits for
the broker's receipts, so an application that needs to know its acks are
durable (before committing elsewhere) can.

Flow control is the broker's credit: ``credit`` messages may be on their way
or buffered here, and credit is granted back (``Flow``) as the application
takes messages, half a window at a time; ``pause`` stops granting it, so the
broker stops sending once what is granted has arrived.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final, Protocol

import attrs
import trio

from broky.client.buffered import BufferedRuns, CreditOwner, FrameRuns
from broky.client.consumer_options import ConsumerOptions
from broky.client.decoding import decode_delivered_run
from broky.client.delivery import Delivery, convert_located, convert_runs, settle_ranges
from broky.client.errors import (
    BrokyError,
    ConnectionClosed,
    ConsumerRefused,
    SubscriptionError,
    unwrapped,
)
from broky.client.settling import SettleBatcher
from broky.protocol.constants import ErrorCode, SettleKind
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import LocatedDeliver, Redelivered, Run, Settled, Unsubscribe

log = logging.getLogger("broky.client")

#: Seconds a closing consumer waits for the receipts of its last acks: long
#: enough for a few group commits on a loaded broker, short enough that a
#: broker that stopped answering does not hold the application's exit.
CLOSE_RECEIPT_TIMEOUT: Final = 5.0


class ConsumerOwner(CreditOwner, Protocol):
    """What a consumer needs of its client (``Client``)."""

    def _next_stream(self) -> int: ...

    def _adopt(self, consumer: Consumer) -> None: ...

    def _forget(self, subscription: object) -> None: ...


@attrs.frozen
class ConsumerStatistics:
    """Counters of one consumer."""

    received: int
    acked: int
    nacked: int
    termed: int
    #: Acked offsets the broker had meanwhile redelivered to another consumer.
    stale_acks: int
    #: Settled offsets the broker could not confirm (their owner worker
    #: restarted first): they are delivered again.
    unconfirmed_settles: int
    #: Outcomes recorded but not sent yet, and frames sent without a receipt yet.
    pending_settles: int
    unreceipted_frames: int
    buffered_messages: int
    paused: bool


class Consumer(BufferedRuns[Delivery]):
    """One consumer of a durable subscription; iterate it with ``async for``
    (or ``batches``), as a ``Subscription``; ``pause``/``resume`` hold back
    and grant again the credit.

    Which topic a delivered run belongs to: a ``Deliver`` frame does not
    say, but a ``Redelivered`` frame names the topic of every Deliver after
    it on the stream until the next one; the broker sends one (listing no
    messages if none is redelivered) whenever a stream's deliveries switch
    topic (docs/protocol.md). Runs before any Redelivered get "" (not
    named), which a broker resolves in ``Settle`` when the consumer reads a
    single topic.
    """

    def __init__(self, client: ConsumerOwner, stream: int, options: ConsumerOptions) -> None:
        super().__init__(client, stream, options.credit)
        self._owner = client
        self.options = options
        #: The topic the last Redelivered named for the Delivers after it ("": none).
        self._next_topic = ""
        #: The topic of the buffered runs, oldest first: [topic, runs] spans
        #: (``_convert`` takes runs in the order ``_deliver`` got them).
        self._topics: deque[tuple[str, int]] = deque()
        #: Delivery counts (> 1) of messages not yet handed to the application.
        self._counts: dict[tuple[str, int, int], int] = {}
        self._batcher = SettleBatcher(stream, options.ack_batch)
        self._flush_wanted = trio.Event()
        self._unreceipted: set[int] = set()
        self._receipt = trio.Event()
        self._outcomes = dict.fromkeys(SettleKind, 0)
        self._stale = 0
        self._unconfirmed = 0

    # called by the client's reader task --------------------------------------

    def _deliver(self, runs: tuple[Run, ...]) -> None:
        self._buffer_items(len(runs))
        super()._deliver(runs)

    def _deliver_located(self, frame: LocatedDeliver) -> None:
        if frame.runs:
            self._buffer_items(1)
        super()._deliver_located(frame)

    def _buffer_items(self, items: int) -> None:
        """Count ``items`` more buffered items (runs, or frames of runs) of
        the topic the last Redelivered named."""
        topic = self._next_topic
        topics = self._topics
        if topics and topics[-1][0] == topic:
            topics[-1] = (topic, topics[-1][1] + items)
        else:
            topics.append((topic, items))

    def _receive(self, frame: Redelivered | Settled) -> None:
        if isinstance(frame, Settled):
            self._unreceipted.discard(frame.sequence)
            self._stale += frame.stale
            if frame.unconfirmed:
                self._unconfirmed += frame.unconfirmed
                log.info(
                    "consumer %d: %d settled messages were not confirmed (an owner worker "
                    "restarted): they will be delivered again",
                    self.stream,
                    frame.unconfirmed,
                )
            self._receipt.set()
            return
        self._next_topic = topic = frame.topic
        counts = self._counts
        for partition, offset, count in zip(
            frame.partitions, frame.offsets, frame.counts, strict=True
        ):
            counts[topic, partition, offset] = count

    def _fail(self, error: BaseException) -> None:
        super()._fail(error)
        self._receipt.set()
        self._flush_wanted.set()

    # iteration ----------------------------------------------------------------

    def _take(self, limit: int) -> tuple[list[Delivery], int]:
        """``BufferedRuns._take``, the runs of each topic span converted in
        one ``convert_runs`` call, a frame's runs in one ``convert_located``
        call; a run either stops at (a message not in the fixed layout)
        goes through ``_convert``."""
        runs = self._runs
        items: list[Delivery] = []
        taken = 0
        counts = self._counts
        while runs:
            front = runs[0]
            topic, left = self._topics[0]
            if isinstance(front, FrameRuns):
                done = 0
                if convert_located is not None:
                    done, taken = convert_located(front, limit, taken, self, topic, counts, items)
                if not front.runs:
                    runs.popleft()
                    self._took_runs(topic, left, 1)
                elif not done:
                    # Its next run is of another layout or does not fit:
                    # taken out as a Run, it goes the way of any other.
                    self._split(front)
                continue
            if taken and taken + front.count > limit:
                break
            used, taken = convert_runs(runs, left, limit, taken, self, topic, counts, items)
            if used:
                self._took_runs(topic, left, used)
                continue
            runs.popleft()
            taken += front.count
            items = self._convert_one(front, items)
        return items, taken

    def _split_off(self) -> None:
        topic, left = self._topics[0]
        self._topics[0] = (topic, left + 1)

    def _took_runs(self, topic: str, left: int, used: int) -> None:
        """Count ``used`` runs off the oldest topic span (``left`` runs)."""
        if left == used:
            self._topics.popleft()
        else:
            self._topics[0] = (topic, left - used)

    def _convert(self, run: Run) -> list[Delivery]:
        topic, left = self._topics[0]
        self._took_runs(topic, left, 1)
        counts = self._counts
        try:
            messages = decode_delivered_run(run)
        except RemoteProtocolError:
            # Not acked, so the broker redelivers it after the ack timeout
            # and dead-letters it after max_deliveries.
            for offset in range(run.base_offset, run.base_offset + run.count):
                counts.pop((topic, run.partition, offset), None)
            raise
        if counts:
            return [
                Delivery(
                    self, message, topic, counts.pop((topic, run.partition, message.offset), 1)
                )
                for message in messages
            ]
        return [Delivery(self, message, topic, 1) for message in messages]

    # settling -------------------------------------------------------------------

    def _settle(
        self,
        kind: SettleKind,
        deliveries: Sequence[Delivery],
        delay_ms: int = -1,
        reason: str = "",
    ) -> None:
        """Record one outcome for each of ``deliveries``; send the batch
        when it is full, else make sure the timer will."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise SubscriptionError(
                ErrorCode.UNKNOWN_STREAM, "the consumer is closed: settle before leaving its block"
            )
        folded = settle_ranges(deliveries)
        if self._batcher.add_folded(kind, folded, len(deliveries), delay_ms, reason):
            self._send_settles()
        self._outcomes[kind] += len(deliveries)
        if self._batcher.pending:
            self._flush_wanted.set()

    async def settle_all(
        self, deliveries: Sequence[Delivery], kind: SettleKind = SettleKind.ACK
    ) -> None:
        """Settle every delivery of a batch the same way (default: ack them)."""
        self._settle(kind, deliveries)
        await trio.lowlevel.checkpoint()

    def _send_settles(self) -> None:
        if self._owner.closed:
            return
        for frame in self._batcher.take():
            self._unreceipted.add(frame.sequence)
            self._owner._send_control(frame)

    async def flush(self) -> None:
        """Send every recorded outcome now and wait until the broker has
        committed all settles sent so far (its ``Settled`` receipts): from
        then on a broker crash does not undo these acks (but for those the
        receipts counted as unconfirmed, ``statistics().unconfirmed_settles``:
        an owner worker restarted before it saw them, and they come again).

        Raises the consumer's error if it failed (the connection closed, the
        broker ended the consumer) before every receipt arrived.
        """
        self._send_settles()
        waiting = set(self._unreceipted)
        while waiting & self._unreceipted:
            if self._error is not None:
                raise self._error
            if self._owner.closed:
                raise ConnectionClosed("the client closed before the broker confirmed the acks")
            self._receipt = trio.Event()
            await self._receipt.wait()
        await trio.lowlevel.checkpoint()

    async def _ack_timer(self) -> None:
        """Send what was recorded ``ack_interval`` seconds after the first
        pending outcome; sleeps while nothing is pending."""
        while self._error is None:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            await trio.sleep(self.options.ack_interval)
            self._send_settles()

    # closing ----------------------------------------------------------------

    async def _close(self) -> None:
        """Send what was recorded, wait (bounded) for its receipts, then leave."""
        if self._closed:
            return
        if self._error is None and not self._owner.closed:
            with trio.move_on_after(CLOSE_RECEIPT_TIMEOUT) as waited:
                try:
                    await self.flush()
                except BrokyError as exc:
                    log.warning("consumer %d: its last acks may be lost: %s", self.stream, exc)
            if waited.cancelled_caught:
                log.warning(
                    "consumer %d: no receipt for its last acks within %s s",
                    self.stream,
                    CLOSE_RECEIPT_TIMEOUT,
                )
        self._closed = True
        self._ready.set()
        self._owner._forget(self)
        if not self._owner.closed:
            self._owner._send_control(Unsubscribe(self.stream))

    def statistics(self) -> ConsumerStatistics:
        """What this consumer received and settled, and what it holds."""
        return ConsumerStatistics(
            received=self.received,
            acked=self._outcomes[SettleKind.ACK],
            nacked=self._outcomes[SettleKind.NACK],
            termed=self._outcomes[SettleKind.TERM],
            stale_acks=self._stale,
            unconfirmed_settles=self._unconfirmed,
            pending_settles=self._batcher.pending,
            unreceipted_frames=len(self._unreceipted),
            buffered_messages=self.buffered_messages,
            paused=self._paused,
        )


@asynccontextmanager
async def open_consumer(client: ConsumerOwner, options: ConsumerOptions) -> AsyncIterator[Consumer]:
    """Attach a consumer, yield it once the broker confirmed, and on exit
    flush its settles and leave (what it held unacked is redelivered).

    Raises ConsumerRefused if the broker refuses the attach (an exclusive
    subscription already taken, another type than the subscription's, a
    broker without durable subscriptions): the message says which.
    """
    if client.closed:
        raise ConnectionClosed("the client is closed")
    consumer = Consumer(client, client._next_stream(), options)
    client._adopt(consumer)
    client._send_control(options.consume(consumer.stream))
    await consumer._confirmed.wait()
    error = consumer._error
    if error is not None:
        client._forget(consumer)
        if isinstance(error, BrokyError) and error.code is ErrorCode.SUBSCRIPTION_REFUSED:
            raise ConsumerRefused(error.code, error.reason) from error
        raise error
    with unwrapped():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer._ack_timer)
            try:
                yield consumer
            finally:
                with trio.CancelScope(shield=True):
                    await consumer._close()
                nursery.cancel_scope.cancel()
