"""A consumer's settle tracking under any interleaving (hypothesis state machine).

The application settles deliveries (ack, nack with or without a delay,
term with a reason) of two topics and partitions, the ack timer fires, and
receipts come back in any order. Invariants: every outcome is either sent
exactly once or still pending, a batch never waits at or above
``ack_batch``, every sent frame asks for a receipt with a fresh sequence,
and the consumer's count of unreceipted frames is exactly what was sent and
not answered.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broky.client.consumer import Consumer
from broky.client.consumer_options import consumer_options
from broky.client.delivery import Delivery
from broky.protocol.constants import SettleKind
from broky.protocol.frames import Frame, Settle, Settled
from broky.protocol.message import Message

ACK_BATCH = 6
Outcome = tuple[SettleKind, str, int, int, int, str]


class Recorder:
    """The client, as far as a consumer sees it: records what it sends."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[Settle] = []

    def _send_control(self, frame: Frame) -> None:
        assert isinstance(frame, Settle), frame
        self.sent.append(frame)

    def _next_stream(self) -> int:
        return 1

    def _adopt(self, consumer: Consumer) -> None:
        pass

    def _forget(self, subscription: object) -> None:
        pass


class ConsumerTracking(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.client = Recorder()
        options = consumer_options("orders.>", "s", "shared", {"ack_batch": ACK_BATCH})
        self.consumer = Consumer(self.client, 1, options)
        self.next_offset = {0: 0, 1: 0}
        self.recorded: set[Outcome] = set()
        self.receipted: set[int] = set()

    @rule(
        kind=st.sampled_from([SettleKind.ACK, SettleKind.NACK, SettleKind.TERM]),
        topic=st.sampled_from(["", "orders"]),
        partition=st.sampled_from([0, 1]),
        skip=st.integers(min_value=0, max_value=3),
        delay_ms=st.sampled_from([-1, 0, 250]),
        reason=st.sampled_from(["", "poison"]),
    )
    def settle(
        self, kind: SettleKind, topic: str, partition: int, skip: int, delay_ms: int, reason: str
    ) -> None:
        # A fresh offset each time (each delivery settled once), with gaps.
        offset = self.next_offset[partition] + skip
        self.next_offset[partition] = offset + 1
        message = Message("orders.k", b"", partition=partition, offset=offset)
        delivery = Delivery(self.consumer, message, topic, 1)
        delay_ms = delay_ms if kind is SettleKind.NACK else -1
        reason = reason if kind is SettleKind.TERM else ""
        self.consumer._settle(kind, (delivery,), delay_ms, reason)
        self.recorded.add((kind, topic, partition, offset, delay_ms, reason))

    @rule()
    def timer_fires(self) -> None:
        self.consumer._send_settles()

    @rule(data=st.data())
    def receipt_arrives(self, data: st.DataObject) -> None:
        waiting = sorted({f.sequence for f in self.client.sent} - self.receipted)
        if not waiting:
            return
        sequence = data.draw(st.sampled_from(waiting))
        self.consumer._receive(Settled(1, sequence, stale=0))
        self.receipted.add(sequence)

    def _sent(self) -> list[Outcome]:
        return [
            (frame.kind, frame.topic, partition, offset, frame.delay_ms, frame.reason)
            for frame in self.client.sent
            for partition, first, last in zip(
                frame.partitions, frame.first_offsets, frame.last_offsets, strict=True
            )
            for offset in range(first, last + 1)
        ]

    @invariant()
    def every_outcome_is_sent_once_or_pending(self) -> None:
        sent = self._sent()
        assert len(sent) == len(set(sent)), "an outcome was sent twice"
        assert set(sent) <= self.recorded, "something never recorded was sent"
        pending = self.consumer.statistics().pending_settles
        assert len(self.recorded) - len(sent) == pending
        assert pending < ACK_BATCH

    @invariant()
    def receipts_are_tracked_per_frame(self) -> None:
        sequences = [frame.sequence for frame in self.client.sent]
        assert sequences == list(range(1, len(sequences) + 1))
        unreceipted = len(set(sequences) - self.receipted)
        assert self.consumer.statistics().unreceipted_frames == unreceipted

    @invariant()
    def counts_match_what_the_application_did(self) -> None:
        stats = self.consumer.statistics()
        by_kind = [outcome[0] for outcome in self.recorded]
        assert (stats.acked, stats.nacked, stats.termed) == (
            by_kind.count(SettleKind.ACK),
            by_kind.count(SettleKind.NACK),
            by_kind.count(SettleKind.TERM),
        )


TestConsumerTracking = ConsumerTracking.TestCase
