"""Direct writes: at light load the routing task writes to an idle
subscriber's socket itself (ConnectionWriter.write_directly)."""

from __future__ import annotations

import trio

from broky import Broker, Config, SlowConsumerPolicy
from broky.protocol.frames import Deliver, Publish, Subscribe, Subscribed
from broky.protocol.message import decode_run
from tests.conftest import RawConnection, StartBroker, raw_connection, raw_run


async def _subscribe(connection: RawConnection, pattern: bytes) -> None:
    await connection.handshake("subscriber")
    await connection.send_frame(Subscribe(1, pattern, SlowConsumerPolicy.DROP, 0))
    assert await connection.receive_frame() == Subscribed(1)


async def _payloads(connection: RawConnection, count: int) -> list[bytes]:
    payloads: list[bytes] = []
    while len(payloads) < count:
        frame = await connection.receive_frame()
        assert isinstance(frame, Deliver), frame
        for run in frame.runs:
            payloads.extend(message.payload for message in decode_run(run))
    return payloads


async def test_a_message_to_an_idle_subscriber_is_written_by_the_router(broker: Broker) -> None:
    with trio.fail_after(10):
        async with raw_connection(broker) as subscriber, raw_connection(broker) as publisher:
            await _subscribe(subscriber, b"direct.>")
            await publisher.handshake("publisher")
            before = broker.counters.direct_writes
            for index in range(3):
                await publisher.send_frame(Publish(1, (raw_run(b"direct.x", b"%d" % index),)))
                assert await _payloads(subscriber, 1) == [b"%d" % index]
            assert broker.counters.direct_writes >= before + 3


async def test_what_a_direct_write_leaves_unsent_goes_first(start_broker: StartBroker) -> None:
    # A subscriber with a tiny receive buffer that reads only at the end:
    # direct writes are cut short, and the writer must send the rest of a
    # frame before anything routed meanwhile (two publishers race to route),
    # or the stream would be corrupt. More is sent than the kernel buffers
    # (4 MiB at most here); the outbox holds the rest.
    broker = await start_broker(Config(port=0, outbox_bytes=64 * 1024 * 1024))
    per_publisher = 24
    with trio.fail_after(30):
        async with (
            raw_connection(broker, receive_buffer=4096) as subscriber,
            raw_connection(broker) as first,
            raw_connection(broker) as second,
        ):
            await _subscribe(subscriber, b"direct.>")

            async def publish(publisher: RawConnection, tag: int) -> None:
                await publisher.handshake(f"publisher-{tag}")
                for index in range(per_publisher):
                    payload = bytes([tag, index]) * 75_000
                    await publisher.send_frame(Publish(1, (raw_run(b"direct.big", payload),)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish, first, 0)
                nursery.start_soon(publish, second, 1)
            received = await _payloads(subscriber, 2 * per_publisher)
    for tag in (0, 1):
        assert [payload[1] for payload in received if payload[0] == tag] == list(
            range(per_publisher)
        )
