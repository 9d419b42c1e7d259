"""The durable-subscription frames on a real broker, and their validation."""

from __future__ import annotations

import pytest
import trio

from broky import Broker
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.constants import ErrorCode, SettleKind
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Consume, Error, Ping, Pong, Settle
from tests.conftest import raw_connection


def test_a_settle_range_that_ends_before_it_starts_is_malformed() -> None:
    data = encode_frame(Settle(1, partitions=(0,), first_offsets=(5,), last_offsets=(4,)))
    with pytest.raises(RemoteProtocolError, match="ends before it starts"):
        decode_frame(data[4:])


def test_settle_vectors_must_be_parallel() -> None:
    data = encode_frame(Settle(1, kind=SettleKind.TERM, partitions=(0, 1), first_offsets=(5,)))
    with pytest.raises(RemoteProtocolError, match="differ in length"):
        decode_frame(data[4:])


async def test_consume_and_settle_get_stream_errors_and_the_connection_stays(
    broker: Broker,
) -> None:
    with trio.fail_after(10):
        async with raw_connection(broker) as raw:
            await raw.handshake()
            await raw.send_frame(Consume(5, "billing", b"orders.>"))
            error = await raw.receive_frame()
            assert isinstance(error, Error)
            assert (error.code, error.stream) == (ErrorCode.SUBSCRIPTION_REFUSED, 5)
            assert "billing" in error.message
            await raw.send_frame(Settle(6, partitions=(0,), first_offsets=(0,), last_offsets=(0,)))
            error = await raw.receive_frame()
            assert isinstance(error, Error)
            assert (error.code, error.stream) == (ErrorCode.UNKNOWN_STREAM, 6)
            await raw.send_frame(Ping(77))
            assert await raw.receive_frame() == Pong(77)
