"""Idempotent acked publishes through a real broker, frame by frame.

A frame sent again with the same producer id and sequences is acked with
the offsets of the first copy and stored once; a frame out of order gets
OutOfOrderSequence; the window survives a restart (rebuilt from the log's
producer columns); a frame of a producer after its failed frame is refused
until the producer resends from there."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio

from broky import Broker, ErrorCode
from broky.durable.acks import AckQueue
from broky.protocol.frames import Error, Publish, PublishAck
from broky.storage.topics import partition_for
from tests.conftest import RawConnection, StartBroker, raw_connection, raw_run
from tests.durable.test_durable_broker import durable_config, fetch_all

TIMEOUT = 20
PRODUCER = 0x1234_5678_9ABC_DEF0


def frame(first_sequence: int, *keys_payloads: tuple[bytes, bytes]) -> Publish:
    runs = tuple(raw_run(key, payload) for key, payload in keys_payloads)
    return Publish(1, runs, ack=True, producer_id=PRODUCER, first_sequence=first_sequence)


async def ack_of(connection: RawConnection) -> PublishAck | Error:
    while True:
        answer = await connection.receive_frame()
        if isinstance(answer, PublishAck | Error):
            return answer


async def offsets_of(connection: RawConnection, publish: Publish) -> list[tuple[int, ...]]:
    await connection.send_frame(publish)
    ack = await ack_of(connection)
    assert isinstance(ack, PublishAck), ack
    return list(zip(ack.runs, ack.partitions, ack.first_offsets, ack.last_offsets, strict=True))


async def test_a_resent_frame_is_stored_once_even_after_a_restart(
    start_broker: StartBroker, tmp_path: Path
) -> None:
    config = attrs.evolve(durable_config(tmp_path), listen=True, port=0)
    # orders.a and orders.c land in different partitions of three.
    assert partition_for(b"orders.a", 3) != partition_for(b"orders.c", 3)
    first = frame(1, (b"orders.a", b"1"), (b"orders.c", b"2"), (b"orders.a", b"3"))
    second = frame(4, (b"orders.b", b"4"))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(config)
            await nursery.start(broker.serve)
            async with raw_connection(broker) as connection:
                await connection.handshake()
                original = await offsets_of(connection, first)
                assert await offsets_of(connection, first) == original
                later = await offsets_of(connection, second)
                # Sent again after a later frame: still the first offsets.
                assert await offsets_of(connection, first) == original
                # Sequence 2 went to orders.c's partition: in orders.a's,
                # between 1 and 3, it would reorder the producer's messages.
                await connection.send_frame(frame(2, (b"orders.a", b"x")))
                error = await ack_of(connection)
                assert isinstance(error, Error)
                assert error.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            broker = Broker(config)
            await nursery.start(broker.serve)
            async with raw_connection(broker) as connection:
                await connection.handshake()
                assert await offsets_of(connection, first) == original
                assert await offsets_of(connection, second) == later
            async with broker.connect() as client:
                stored = await fetch_all(client)
            nursery.cancel_scope.cancel()
    payloads = sorted(m.payload for messages in stored.values() for m in messages)
    assert payloads == [b"1", b"2", b"3", b"4"]


def test_a_producer_must_resend_from_its_failed_frame() -> None:
    sent: list[bytes] = []

    class Outlet:
        def send_control(self, data: bytes) -> None:
            sent.append(data)

    acks = AckQueue(Outlet())  # type: ignore[arg-type]
    ticket = acks.open(1, PRODUCER, 10)
    ticket.remaining += 1
    ticket.failed("owner down", ErrorCode.OWNER_UNAVAILABLE)
    assert acks.resend_needed(PRODUCER, 20) == 10
    assert acks.resend_needed(PRODUCER, 30) == 10
    assert acks.resend_needed(7, 30) is None  # another producer is not held
    assert acks.resend_needed(PRODUCER, 10) is None  # the resend starts
    assert acks.resend_needed(PRODUCER, 20) is None
