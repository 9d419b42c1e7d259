"""The client's acked-frame bookkeeping (sans-IO): numbering, answers in
frame order, and which frames are resent, in which order."""

from __future__ import annotations

from broky.client.acked import AckedFrames, BatchAnswers, SentFrame
from broky.client.durable import AckedRun
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import PublishAck


def sent(acks: AckedFrames, count: int, keys: list[str]) -> SentFrame:
    frame = SentFrame(b"frame%d" % acks.next_sequence, keys, acks.number(count), count)
    acks.opened(count)
    acks.sent(frame, 0.0)
    return frame


def test_sequences_count_messages_and_acks_come_in_order() -> None:
    acks = AckedFrames()
    assert acks.producer_id != 0
    first = sent(acks, 3, ["a", "b"])
    second = sent(acks, 2, ["c"])
    assert (first.first_sequence, second.first_sequence, acks.next_sequence) == (1, 4, 6)
    assert acks.unacked_messages == 5
    acks.acked(PublishAck(1, 1, (0, 1), (4, 2), (10, 7), (11, 7)))
    assert acks.in_flight
    acks.acked(PublishAck(1, 2, (0,), (4,), (12,), (13,)))
    assert not acks.pending
    assert acks.unacked_messages == 0
    assert acks.take_acked() == [
        AckedRun("a", 4, 10, 11),
        AckedRun("b", 2, 7, 7),
        AckedRun("c", 4, 12, 13),
    ]


def test_retriable_failures_and_lost_frames_are_resent_oldest_first() -> None:
    acks = AckedFrames()
    frames = [sent(acks, 2, ["k"]) for _ in range(4)]
    acks.failed(ErrorCode.OWNER_UNAVAILABLE, "owner down")
    acks.acked(PublishAck(1, 2, (0,), (0,), (0,), (1,)))
    acks.connection_lost()  # frames 3 and 4 never answered
    assert not acks.in_flight
    assert acks.pending
    resend = acks.take_resend()
    assert resend == [frames[0], frames[2], frames[3]]
    assert [frame.first_sequence for frame in resend] == [1, 5, 7]
    assert acks.take_error() is None
    assert acks.unacked_messages == 6


def test_other_errors_are_reported_and_not_resent() -> None:
    acks = AckedFrames()
    sent(acks, 1, ["k"])
    acks.failed(ErrorCode.STORAGE_FAILURE, "disk full")
    error = acks.take_error()
    assert error is not None
    assert error.code is ErrorCode.STORAGE_FAILURE
    assert not acks.pending


def test_without_idempotence_nothing_is_resent() -> None:
    acks = AckedFrames(idempotent=False)
    assert acks.producer_id == 0
    sent(acks, 1, ["k"])
    sent(acks, 1, ["k"])
    acks.failed(ErrorCode.OWNER_UNAVAILABLE, "owner down")
    acks.connection_lost()
    assert not acks.pending
    error = acks.take_error()
    assert error is not None
    assert error.code is ErrorCode.OWNER_UNAVAILABLE


def test_giving_up_starts_a_new_producer() -> None:
    acks = AckedFrames()
    producer = acks.producer_id
    sent(acks, 3, ["k"])
    acks.failed(ErrorCode.OWNER_UNAVAILABLE, "owner down")
    assert acks.abandon() == 3
    assert not acks.pending
    assert acks.producer_id != producer
    assert acks.next_sequence == 1


def test_a_batch_s_frames_are_answered_to_the_batch_and_never_resent() -> None:
    acks = AckedFrames()
    batch = acks.batch = BatchAnswers()
    first = SentFrame(b"a", ["k"], acks.number(2), 2, batch=batch)
    second = SentFrame(b"b", ["k"], acks.number(1), 1, batch=batch)
    acks.batch = None
    batch.frames = 2
    other = sent(acks, 1, ["o"])
    for frame in (first, second):
        acks.opened(frame.count)
        acks.sent(frame, 0.0)
    acks.acked(PublishAck(1, 1, (0,), (3,), (5,), (5,)))  # the frame sent first: ``other``
    acks.acked(PublishAck(1, 2, (0,), (3,), (6,), (7,)))
    assert not batch.complete
    acks.failed(ErrorCode.NOT_ENOUGH_REPLICAS, "too few")
    assert batch.answered == batch.frames  # complete
    assert batch.error is not None
    assert batch.error.code is ErrorCode.NOT_ENOUGH_REPLICAS
    assert len(batch.acks) == 1
    assert not acks.pending  # the caller retries it, not the client
    assert acks.take_acked() == [AckedRun("o", 3, 5, 5)]
    assert other.first_sequence == 4
    assert acks.unacked_messages == 0


def test_a_holding_refusal_moves_the_producer_to_a_new_id() -> None:
    """The partition holds the producer's later frames back until the
    refused one is resent, which this client does not do."""
    acks = AckedFrames()
    before = acks.producer_id
    sent(acks, 1, ["k"])
    acks.failed(ErrorCode.NOT_LEADER, "not the leader")
    assert acks.producer_id != before
    assert acks.next_sequence == 1
    assert acks.take_error() is not None
