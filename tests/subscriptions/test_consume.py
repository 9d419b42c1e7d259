"""Durable subscriptions end to end over real sockets: each type, acks,
redelivery, dead letters."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from broky import Client
from broky.protocol.constants import (
    AdoptSetting,
    ErrorCode,
    SettleKind,
    StartKind,
    SubscriptionKind,
)
from broky.protocol.frames import Error, Subscribed
from tests.conftest import StartBroker
from tests.observability.test_observability import http_get, sample_value
from tests.subscriptions.wire import Consumer, Delivery, connect, subscriptions_config

TIMEOUT = 20


async def publish(client: Client, count: int, start: int = 0, keys: int = 8) -> None:
    for index in range(start, start + count):
        await client.publish(f"orders.k{index % keys}", str(index).encode(), ack=True)
    await client.flush_acks()


def numbers(deliveries: list[Delivery]) -> list[int]:
    return [int(d.payload) for d in deliveries]


async def test_shared_spreads_and_acked_messages_stay_acked(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with (
            broker.connect() as client,
            connect(broker.address) as a,
            connect(broker.address) as b,
        ):
            first, second = Consumer(a), Consumer(b)
            # Credit 20 each: 40 messages can only go 20 and 20 (slices are
            # dealt by free credit, not one by one).
            assert isinstance(
                await first.consume("work", start=StartKind.EARLIEST, credit=20), Subscribed
            )
            assert isinstance(
                await second.consume("work", start=StartKind.EARLIEST, credit=20), Subscribed
            )
            await publish(client, 40)
            got_first = await first.take(20)
            got_second = await second.take(20)
            assert sorted(numbers(got_first + got_second)) == list(range(40))
            assert all(d.count == 1 for d in got_first + got_second)
            sequence = await first.settle(got_first, receipt=True)
            assert (await first.receipt(sequence)).stale == 0
            sequence = await second.settle(got_second, receipt=True)
            await second.receipt(sequence)
        status = broker.statistics().subscriptions
        assert [(s.name, s.backlog, s.in_flight, s.acked) for s in status] == [("work", 0, 0, 40)]


async def test_shared_on_a_narrower_pattern_skips_the_other_keys(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    """Matching runs between skipped ones are dealt (consecutive ones as one
    range), and the skipped ones count as acked: nothing is left behind."""
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path, partitions=1))
        assert broker.address is not None
        async with broker.connect() as client, connect(broker.address) as a:
            consumer = Consumer(a)
            subscribed = await consumer.consume(
                "eu", pattern=b"orders.eu.>", start=StartKind.EARLIEST, credit=100
            )
            assert isinstance(subscribed, Subscribed)
            for index in range(30):
                region = "us" if index % 3 == 0 else "eu"
                await client.publish(f"orders.{region}.{index}", str(index).encode(), ack=True)
            await client.flush_acks()
            got = await consumer.take(20)
            assert numbers(got) == [index for index in range(30) if index % 3]
            await consumer.receipt(await consumer.settle(got, receipt=True))
        status = broker.statistics().subscriptions
        assert [(s.name, s.backlog, s.in_flight, s.acked) for s in status] == [("eu", 0, 0, 20)]


async def test_exclusive_refuses_a_second_consumer(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with connect(broker.address) as a, connect(broker.address) as b:
            kind = SubscriptionKind.EXCLUSIVE
            assert isinstance(await Consumer(a).consume("solo", kind=kind), Subscribed)
            refused = await Consumer(b).consume("solo", kind=kind)
            assert isinstance(refused, Error)
            assert refused.code == ErrorCode.SUBSCRIPTION_REFUSED
            assert "exclusive" in refused.message
            other = await Consumer(b, stream=2).consume("solo", kind=SubscriptionKind.SHARED)
            assert isinstance(other, Error)
            assert "fixed at creation" in other.message


async def test_nack_redelivers_with_count_then_dead_letters(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with broker.connect() as client, connect(broker.address) as a:
            dead = await client.subscribe("_dlq.>")
            consumer = Consumer(a)
            subscribed = await consumer.consume(
                "poison", start=StartKind.EARLIEST, max_deliveries=3, backoff_ms=(0,)
            )
            assert isinstance(subscribed, Subscribed)
            await publish(client, 1)
            counts = []
            for _ in range(3):
                [delivery] = await consumer.take(1)
                counts.append(delivery.count)
                await consumer.settle([delivery], SettleKind.NACK, reason="cannot parse")
            assert counts == [1, 2, 3]
            async for message in dead:
                tags = dict(message.tags)
                assert message.payload == b"0"
                assert tags["dlq.subscription"] == "poison"
                assert tags["dlq.error"] == "cannot parse"
                assert tags["dlq.deliveries"] == "3"
                assert tags["dlq.topic"] == "orders"
                break
        status = broker.statistics().subscriptions[0]
        assert (status.dead_lettered, status.backlog) == (1, 0)


async def test_backlog_in_flight_and_consumers_are_listed_and_exported(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    config = attrs.evolve(subscriptions_config(tmp_path), metrics_listen=True, metrics_port=0)
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(config)
        assert broker.address is not None
        metrics = broker.observability.metrics_address
        assert metrics is not None
        async with broker.connect() as client, connect(broker.address) as a:
            consumer = Consumer(a)
            assert isinstance(await consumer.consume("listed", credit=3), Subscribed)
            await publish(client, 10)
            await consumer.take(3)
            status, body = await http_get(metrics, "/subscriptions")
            assert status == 200
            [listed] = json.loads(body)["subscriptions"]
            assert (listed["name"], listed["type"], listed["consumers"]) == ("listed", "shared", 1)
            assert (listed["backlog"], listed["in_flight"], listed["delivered"]) == (10, 3, 3)
            status, text = await http_get(metrics, "/metrics")
            labels = 'subscription="listed",worker="0"'
            assert sample_value(text, "broky_subscription_backlog_messages", labels) == 10
            assert sample_value(text, "broky_subscription_in_flight_messages", labels) == 3
            assert sample_value(text, "broky_subscription_delivered_messages_total", labels) == 3


async def test_a_new_subscription_starts_where_its_start_position_says(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    """Earliest, latest and by offset are taken from the owner's copy of the
    log's offsets (no hand-off to its thread), by time from its time index:
    each names the first offset delivered."""
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path, partitions=1))
        assert broker.address is not None
        async with broker.connect() as client:
            await publish(client, 10)
            await trio.sleep(0.05)
            middle = time.time_ns()
            await trio.sleep(0.05)
            await publish(client, 10, start=10)
            starts: dict[str, dict[str, Any]] = {
                "earliest": {"start": StartKind.EARLIEST},
                "latest": {"start": StartKind.LATEST},
                "offset": {"start": StartKind.OFFSET, "start_offsets": (7,)},
                "past-the-end": {"start": StartKind.OFFSET, "start_offsets": (500,)},
                "time": {"start": StartKind.TIME, "start_time": middle},
            }
            firsts: dict[str, int] = {}
            async with contextlib.AsyncExitStack() as stack:
                consumers = {}
                for name, fields in starts.items():
                    raw = await stack.enter_async_context(connect(broker.address))
                    consumers[name] = Consumer(raw)
                    assert isinstance(await consumers[name].consume(name, **fields), Subscribed)
                await publish(client, 5, start=20)
                for name, consumer in consumers.items():
                    firsts[name] = (await consumer.next())[0].offset
        assert firsts == {
            "earliest": 0,
            "latest": 20,
            "offset": 7,
            "past-the-end": 20,
            "time": 10,
        }


async def test_bad_consumes_get_stream_errors_and_the_connection_stays(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with connect(broker.address) as a:
            consumer = Consumer(a)
            bad = await consumer.consume("x", pattern=b"orders..>")
            assert isinstance(bad, Error)
            assert bad.code == ErrorCode.INVALID_PATTERN
            nowhere = await consumer.consume("x", pattern=b"prices.>")
            assert isinstance(nowhere, Error)
            assert "matches no durable topic" in nowhere.message
            last = await consumer.consume("x", start=StartKind.LAST)
            assert isinstance(last, Error)
            assert last.code == ErrorCode.SUBSCRIPTION_REFUSED
            assert isinstance(await consumer.consume("x"), Subscribed)
            duplicate = await consumer.consume("y")
            assert isinstance(duplicate, Error)
            assert duplicate.code == ErrorCode.DUPLICATE_STREAM


async def test_a_join_with_other_redelivery_settings_is_refused_unless_it_adopts_them(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    """The redelivery settings are the subscription's, fixed at creation: a
    later Consume with other values is refused naming both (JetStream's
    "consumer already exists with different config"), never served with the
    creator's in silence; one that adopts them joins."""
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with connect(broker.address) as a, connect(broker.address) as b:
            created = await Consumer(a).consume(
                "work", ack_timeout_ms=2_000, max_deliveries=3, backoff_ms=(100, 500)
            )
            assert isinstance(created, Subscribed)
            joiner = Consumer(b)
            for fields, named in (
                ({"ack_timeout_ms": 5_000}, "ack_timeout_ms 2000, not 5000"),
                ({"max_deliveries": 10}, "max_deliveries 3, not 10"),
                ({"backoff_ms": (100,)}, "backoff_ms [100, 500], not [100]"),
            ):
                settings = {"ack_timeout_ms": 2_000, "max_deliveries": 3, "backoff_ms": (100, 500)}
                refused = await joiner.consume("work", **{**settings, **fields})
                assert isinstance(refused, Error)
                assert refused.code == ErrorCode.SUBSCRIPTION_REFUSED
                assert named in refused.message
                assert "fixed at creation" in refused.message
            same = await joiner.consume(
                "work", ack_timeout_ms=2_000, max_deliveries=3, backoff_ms=(100, 500)
            )
            assert isinstance(same, Subscribed)
            adopting = await Consumer(b, stream=2).consume(
                "work",
                adopt_settings=int(
                    AdoptSetting.ACK_TIMEOUT | AdoptSetting.MAX_DELIVERIES | AdoptSetting.BACKOFF
                ),
            )
            assert isinstance(adopting, Subscribed)
