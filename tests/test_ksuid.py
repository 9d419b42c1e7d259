"""KSUID helper: layout, time order, and use as a message uid."""

from __future__ import annotations

import pytest
import trio

import broky
from broky.ksuid import KSUID_EPOCH, ksuid_time, new_ksuid


def test_layout_and_time_round_trip() -> None:
    uid = new_ksuid(now=KSUID_EPOCH + 1234)
    assert len(uid) == 20
    assert uid[:4] == (1234).to_bytes(4, "big")
    assert ksuid_time(uid) == KSUID_EPOCH + 1234


def test_unique_and_sortable_by_time() -> None:
    uids = [new_ksuid(now=KSUID_EPOCH + second) for second in (5, 1, 3)]
    assert len(set(uids)) == 3
    assert [ksuid_time(uid) for uid in sorted(uids)] == [
        KSUID_EPOCH + 1,
        KSUID_EPOCH + 3,
        KSUID_EPOCH + 5,
    ]


def test_wrong_length_is_rejected() -> None:
    with pytest.raises(ValueError, match="20 bytes"):
        ksuid_time(b"short")


async def test_a_ksuid_travels_as_the_message_uid() -> None:
    broker = broky.Broker(broky.Config(listen=False))

    async with trio.open_nursery() as nursery:
        await nursery.start(broker.serve)
        async with broker.connect() as client, client.subscription("ids") as subscription:
            uid = broky.new_ksuid()
            await client.publish("ids", b"x", uid=uid)
            message = await anext(subscription)
            assert message.uid == uid
        nursery.cancel_scope.cancel()
