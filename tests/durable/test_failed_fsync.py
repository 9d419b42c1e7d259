"""A partition whose fsync failed acknowledges nothing until the broker restarts.

The failed round's records were written (the dedup window knows their
sequences) but may not be on disk. A retry of them must not be answered
from the window as if stored, and later publishes must not be acked by an
fsync that "succeeds" without the lost pages (fsyncgate). After a restart
recovery reads what the disk holds and the producer carries on."""

from __future__ import annotations

import errno
from pathlib import Path

import attrs
import pytest
import trio

from broky import Broker, ErrorCode
from broky.protocol.frames import Error, PublishAck
from broky.storage.segment import Segment
from tests.conftest import StartBroker, raw_connection
from tests.durable.test_durable_broker import durable_config
from tests.durable.test_idempotent_publish import ack_of, frame, offsets_of

TIMEOUT = 20


async def test_no_ack_after_a_failed_fsync_until_restart(
    start_broker: StartBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = attrs.evolve(durable_config(tmp_path, fsync="always"), listen=True, port=0)
    failing = False
    real_sync = Segment.sync

    def sync(self: Segment) -> None:
        if failing:
            raise OSError(errno.EIO, "Input/output error")
        real_sync(self)

    monkeypatch.setattr(Segment, "sync", sync)
    first = frame(1, (b"orders.a", b"1"))
    second = frame(2, (b"orders.a", b"2"))
    third = frame(3, (b"orders.a", b"3"))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(config)
            await nursery.start(broker.serve)
            async with raw_connection(broker) as connection:
                await connection.handshake()
                stored = await offsets_of(connection, first)
                failing = True
                await connection.send_frame(second)
                refused = await ack_of(connection)
                assert isinstance(refused, Error)
                assert refused.code is ErrorCode.STORAGE_FAILURE
                failing = False  # the disk answers again, the lost pages are still lost
                for retry in (second, third):
                    await connection.send_frame(retry)
                    answer = await ack_of(connection)
                    assert isinstance(answer, Error), f"acked after a failed fsync: {answer}"
                    assert answer.code is ErrorCode.STORAGE_FAILURE
                    assert "no more writes" in answer.message
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            broker = Broker(config)
            await nursery.start(broker.serve)
            async with raw_connection(broker) as connection:
                await connection.handshake()
                assert await offsets_of(connection, first) == stored
                # What recovery found on disk is acked at its offset, once.
                retried = await offsets_of(connection, second)
                assert retried[0][2] == stored[0][2] + 1
                await connection.send_frame(third)
                assert isinstance(await ack_of(connection), PublishAck)
            nursery.cancel_scope.cancel()
