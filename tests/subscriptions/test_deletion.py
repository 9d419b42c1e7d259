"""Deleting a durable subscription (``DeleteSubscription``): real sockets, a
real broker. The rows leave every partition's state store, consumers block
a plain deletion and are ended by a forced one, and the name starts fresh."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import trio

from broky import BrokyError, Client, ErrorCode, Start, SubscriptionDeletion
from broky.protocol.constants import StartKind
from broky.protocol.frames import Subscribed
from broky.subscriptions.partition import STATE_FILE
from tests.conftest import StartBroker
from tests.subscriptions.test_consume import numbers, publish
from tests.subscriptions.wire import Consumer, connect, subscriptions_config

TIMEOUT = 20


def stored_rows(data_dir: Path, name: str) -> int:
    """Rows of subscription ``name`` in every partition's state store."""
    rows = 0
    for path in data_dir.glob(f"*/*/{STATE_FILE}"):
        with sqlite3.connect(path) as database:
            for table in ("subscription_definitions", "subscription_images"):
                query = f"SELECT COUNT(*) FROM {table} WHERE subscription = ?"
                rows += database.execute(query, (name,)).fetchone()[0]
    return rows


async def test_a_deleted_subscription_is_gone_from_every_store_and_starts_fresh(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        async with broker.connect() as client:
            await publish(client, 10)
            async with client.consumer(
                "orders.>", subscription="jobs", start=Start.earliest()
            ) as first:
                async for delivery in first:
                    await delivery.ack()
                    if first.statistics().acked == 10:
                        break
            assert stored_rows(tmp_path, "jobs") == 4  # a definition and an image per partition
            deleted = await client.delete_subscription("jobs", "orders.>")
            assert deleted == SubscriptionDeletion(partitions=2, consumers=0)
            assert stored_rows(tmp_path, "jobs") == 0
            with pytest.raises(BrokyError) as unknown:
                await client.delete_subscription("jobs")
            assert unknown.value.code is ErrorCode.UNKNOWN_SUBSCRIPTION
            # Recreated under the same name: nothing of the old acks or counts.
            async with client.consumer(
                "orders.>", subscription="jobs", start=Start.earliest()
            ) as again:
                got = []
                async for delivery in again:
                    got.append(delivery)
                    await delivery.ack()
                    if len(got) == 10:
                        break
            assert sorted(int(d.payload) for d in got) == list(range(10))
            assert all(d.delivery_count == 1 for d in got)


async def test_consumers_block_a_deletion_unless_forced_then_they_end(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with (
            broker.connect() as client,
            client.subscription("$SYS.events.subscription.deleted") as events,
            connect(broker.address) as raw,
        ):
            await client.flush()
            consumer = Consumer(raw)
            assert isinstance(await consumer.consume("busy", start=StartKind.EARLIEST), Subscribed)
            with pytest.raises(BrokyError) as other_pattern:
                await client.delete_subscription("busy", "orders.eu.>")
            assert other_pattern.value.code is ErrorCode.SUBSCRIPTION_REFUSED
            assert "nothing deleted" in other_pattern.value.reason
            with pytest.raises(BrokyError) as refused:
                await client.delete_subscription("busy")
            assert refused.value.code is ErrorCode.SUBSCRIPTION_REFUSED
            assert "force" in refused.value.reason
            # Refused: the consumer still receives.
            await publish(client, 2)
            assert sorted(numbers(await consumer.take(2))) == [0, 1]
            deleted = await client.delete_subscription("busy", force=True)
            assert deleted == SubscriptionDeletion(partitions=2, consumers=1)
            advisory = json.loads((await anext(events)).payload)
            fields = (advisory["subscription"], advisory["partitions"], advisory["consumers_ended"])
            assert fields == ("busy", 2, 1)
            with trio.move_on_after(5):
                while not consumer.errors:
                    await consumer.next()
            [ended] = consumer.errors
            assert ended.code is ErrorCode.SUBSCRIPTION_DELETED
            assert "deleted" in ended.message
            assert stored_rows(tmp_path, "busy") == 0


async def test_a_forced_deletion_ends_a_client_library_consumer(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        async with broker.connect() as client, broker.connect() as admin:
            await publish(client, 3)
            with pytest.raises(BrokyError) as ended:
                await _consume_and_delete(client, admin)
            assert ended.value.code is ErrorCode.SUBSCRIPTION_DELETED


async def _consume_and_delete(client: Client, admin: Client) -> None:
    """Consume ``lib``; after the first ack is receipted, force-delete it."""
    async with client.consumer("orders.>", subscription="lib", start=Start.earliest()) as c:
        async for delivery in c:
            await delivery.ack()
            await c.flush()
            await _delete_forced(admin)


async def _delete_forced(admin: Client) -> None:
    assert (await admin.delete_subscription("lib", force=True)).consumers == 1
