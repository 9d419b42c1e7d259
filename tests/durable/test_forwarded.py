"""The bookkeeping of forwarded acked publishes, sans I/O: frames out, acks
in, client tickets completed exactly once whatever the owner answers."""

from __future__ import annotations

import pytest

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.forwarded import ForwardedPublishes
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Error, Publish, PublishAck
from broky.router.outbox import Outlet
from broky.router.statistics import RouterCounters
from tests.conftest import raw_run


def acks() -> tuple[AckQueue, list[bytes]]:
    """An ack queue whose frames land in a list."""
    outlet = Outlet(lambda: None, RouterCounters())
    sent: list[bytes] = []
    outlet.send_control = sent.append  # type: ignore[method-assign,assignment]
    return AckQueue(outlet), sent


def test_pieces_of_one_run_travel_joined_and_complete_the_ticket() -> None:
    queue, sent = acks()
    ticket = queue.open(7)
    ticket.remaining = 3  # three pieces of run 0, as DurableStore.append counts them
    publishes = ForwardedPublishes(1 << 20)
    for payload in (b"a", b"b", b"c"):
        assert not publishes.add(raw_run(b"orders.x", payload), ticket, queue, 0)
    data = publishes.take_frame(0.0)
    assert data is not None
    frame = decode_frame(data[4:])
    assert isinstance(frame, Publish)
    assert frame.ack
    assert [run.count for run in frame.runs] == [3]  # one run for the owner
    # The owner's split put all three in one partition: one entry.
    publishes.acked(PublishAck(1, 1, (0,), (2,), (10,), (12,)), owner=1)
    assert ticket.remaining == 0
    queue.release()
    (ack,) = [decode_frame(frame[4:]) for frame in sent]
    assert ack == PublishAck(7, 1, (0,), (2,), (10,), (12,))
    assert publishes.in_flight_bytes == 0


def test_a_mismatched_ack_leaves_the_frame_to_fail_with_the_connection() -> None:
    queue, sent = acks()
    ticket = queue.open(1)
    ticket.remaining = 1
    publishes = ForwardedPublishes(1 << 20)
    publishes.add(raw_run(b"orders.x", b"a"), ticket, queue, 0)
    assert publishes.take_frame(0.0) is not None
    with pytest.raises(RemoteProtocolError):
        publishes.acked(PublishAck(1, 5, (0,), (0,), (0,), (0,)), owner=1)
    assert publishes.oldest_sent_at == 0.0
    assert publishes.fail_all(ErrorCode.OWNER_UNAVAILABLE, "gone") == 1
    queue.release()
    (error,) = [decode_frame(frame[4:]) for frame in sent]
    assert error == Error(ErrorCode.OWNER_UNAVAILABLE, "gone", 1)
    # A new connection's acks count from 1 again.
    ticket = queue.open(1)
    ticket.remaining = 1
    publishes.add(raw_run(b"orders.x", b"b"), ticket, queue, 0)
    publishes.take_frame(1.0)
    publishes.acked(PublishAck(1, 1, (0,), (0,), (4,), (4,)), owner=1)
    assert ticket.remaining == 0


def forwarded_run(stream: int, *pieces: bytes) -> tuple[ForwardedPublishes, AckTicket, list[bytes]]:
    """A client frame on ``stream`` whose run 0 went to the owner as
    ``pieces`` (joined), forwarded in one frame; its ticket and answers."""
    queue, sent = acks()
    ticket = queue.open(stream)
    ticket.remaining = len(pieces)  # as DurableStore.append_frame counts them
    publishes = ForwardedPublishes(1 << 20)
    for payload in pieces:
        publishes.add(raw_run(b"orders.x", payload), ticket, queue, 0)
    assert publishes.take_frame(0.0) is not None
    return publishes, ticket, sent


def test_an_owner_error_fails_every_piece_once() -> None:
    publishes, ticket, sent = forwarded_run(3, b"a", b"b")
    publishes.refused(ErrorCode.STORAGE_FAILURE, "disk full")
    assert ticket.remaining == 0
    assert [decode_frame(frame[4:]) for frame in sent] == [
        Error(ErrorCode.STORAGE_FAILURE, "disk full", 3)
    ]


def test_gathered_runs_past_the_frame_budget_ask_for_a_frame() -> None:
    publishes = ForwardedPublishes(400)
    run = raw_run(b"orders.x", b"x" * 100)
    assert not publishes.add(run, None, None, 0)
    assert publishes.add(run, None, None, 1)
    data = publishes.take_frame(0.0)
    assert data is not None
    assert data == encode_frame(decode_frame(data[4:]))  # a well-formed frame
    assert publishes.take_frame(0.0) is None  # nothing gathered any more


def test_each_run_of_a_forwarded_frame_gets_its_own_outcome() -> None:
    """Runs of two clients in one frame: the owner refused the first and
    stored the second (two pieces, joined here, one entry there). Only the
    first client gets the error; the second gets its offsets."""
    refused_queue, refused_sent = acks()
    refused_ticket = refused_queue.open(5, producer=9, first_sequence=3)
    refused_ticket.remaining = 1
    stored_queue, stored_sent = acks()
    stored_ticket = stored_queue.open(6)
    stored_ticket.remaining = 2  # two pieces of its run 0
    publishes = ForwardedPublishes(1 << 20)
    publishes.add(raw_run(b"orders.x", b"a"), refused_ticket, refused_queue, 0, (9, 3))
    publishes.add(raw_run(b"orders.y", b"b"), stored_ticket, stored_queue, 0)
    publishes.add(raw_run(b"orders.y", b"c"), stored_ticket, stored_queue, 0)
    assert publishes.take_frame(0.0) is not None
    publishes.acked(
        PublishAck(
            1,
            1,
            (1,),
            (4,),
            (20,),
            (21,),
            refused_runs=(0,),
            refused_codes=(ErrorCode.OUT_OF_ORDER_SEQUENCE,),
            refused_reasons=("sequence 3 is out of order",),
        ),
        owner=1,
    )
    assert refused_ticket.remaining == stored_ticket.remaining == 0
    assert [decode_frame(frame[4:]) for frame in refused_sent] == [
        Error(ErrorCode.OUT_OF_ORDER_SEQUENCE, "sequence 3 is out of order", 5)
    ]
    assert [decode_frame(frame[4:]) for frame in stored_sent] == [
        PublishAck(6, 1, (0,), (4,), (20,), (21,))
    ]


def test_a_run_partly_stored_and_partly_refused_fails_once() -> None:
    """The owner stored one piece of a joined run and refused the other
    (two partitions, one of them failing): the client's frame fails, once,
    and its ticket settles exactly."""
    publishes, ticket, sent = forwarded_run(2, b"a", b"b")
    publishes.acked(
        PublishAck(1, 1, (0,), (1,), (0,), (0,), (0,), (ErrorCode.STORAGE_FAILURE,), ("fsync",)),
        owner=1,
    )
    assert ticket.remaining == 0
    assert [decode_frame(frame[4:]) for frame in sent] == [
        Error(ErrorCode.STORAGE_FAILURE, "fsync", 2)
    ]


def test_an_ack_naming_a_run_the_frame_lacks_is_a_protocol_error() -> None:
    publishes, _, sent = forwarded_run(1, b"a")
    with pytest.raises(RemoteProtocolError):
        publishes.acked(
            PublishAck(
                1, 1, refused_runs=(3,), refused_codes=(ErrorCode.INTERNAL,), refused_reasons=("?",)
            ),
            owner=1,
        )
    assert publishes.fail_all(ErrorCode.OWNER_UNAVAILABLE, "gone") == 1  # still outstanding
    assert [decode_frame(frame[4:]) for frame in sent] == [
        Error(ErrorCode.OWNER_UNAVAILABLE, "gone", 1)
    ]
