"""``client.consumer`` against a real broker over real sockets: shared work
split and acked once, nack redelivery with its count, key-shared order, the
CLI, refusals.

Each test bounds itself with ``trio.fail_after``; the broker keeps durable
topic ``orders`` (``orders.>``, 2 partitions) in the test's temp directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import broky
from broky import Client, Delivery, ErrorCode, Start
from broky.cli import build_parser
from broky.client.consumer_options import SubscriptionType
from broky.config import Config
from broky.consume_cli import consume
from tests.conftest import StartBroker, address_of
from tests.subscriptions.wire import subscriptions_config

TIMEOUT = 20


async def _publish(client: Client, count: int, keys: int = 8) -> None:
    for number in range(count):
        await client.publish(f"orders.k{number % keys}", b"%d" % number, ack=True)
    await client.flush_acks()


async def _take_and_ack(
    address: str,
    subscription: str,
    kind: SubscriptionType,
    until: trio.Event,
    seen: list[Delivery],
) -> None:
    async with (
        broky.connect(address) as client,
        client.consumer(
            "orders.>", subscription=subscription, type=kind, start=Start.earliest(), credit=16
        ) as consumer,
    ):
        batches = consumer.batches(8)
        while not until.is_set():
            with trio.move_on_after(0.05):
                batch = await anext(batches)
                seen.extend(batch)
                await consumer.settle_all(batch)
        await consumer.flush()


@pytest.mark.parametrize("kind", ["shared", "key-shared"])
async def test_consumers_split_the_work_and_each_message_is_acked_once(
    tmp_path: Path, start_broker: StartBroker, kind: SubscriptionType
) -> None:
    broker = await start_broker(subscriptions_config(tmp_path))
    address = address_of(broker)
    seen: list[Delivery] = []
    done = trio.Event()
    with trio.fail_after(TIMEOUT):
        async with broky.connect(address) as client:
            await _publish(client, 400)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(_take_and_ack, address, "work", kind, done, seen)
            while len(seen) < 400:  # noqa: ASYNC110 - the consumers append as they take
                await trio.sleep(0.01)
            done.set()
    assert sorted(int(d.payload) for d in seen) == list(range(400))  # none lost, none twice
    # The broker names the topic before a stream's first Deliver (see Consumer).
    assert {d.topic for d in seen} == {"orders"}
    assert all(d.delivery_count == 1 for d in seen)
    if kind == "key-shared":
        by_key: dict[str, list[int]] = {}
        for delivery in seen:
            by_key.setdefault(delivery.key, []).append(int(delivery.payload))
        assert all(numbers == sorted(numbers) for numbers in by_key.values())
    [status] = broker.statistics().subscriptions
    assert (status.name, status.backlog, status.in_flight, status.acked) == ("work", 0, 0, 400)


async def test_a_nacked_message_comes_back_with_its_delivery_count(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    broker = await start_broker(subscriptions_config(tmp_path))
    with trio.fail_after(TIMEOUT):
        async with (
            broker.connect() as client,
            client.consumer("orders.>", subscription="retry", start=Start.earliest()) as consumer,
        ):
            await _publish(client, 1)
            first = await anext(consumer)
            await first.nack(delay=0)
            again = await anext(consumer)
            assert (again.partition, again.offset, again.payload) == (
                first.partition,
                first.offset,
                b"0",
            )
            assert (first.delivery_count, again.delivery_count, again.retry_count) == (1, 2, 1)
            assert (first.topic, again.topic) == ("orders", "orders")
            await again.ack()
            await consumer.flush()
            assert consumer.statistics().unreceipted_frames == 0
    [status] = broker.statistics().subscriptions
    assert (status.acked, status.redelivered, status.in_flight) == (1, 1, 0)


async def test_an_exclusive_subscription_refuses_a_second_consumer(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    broker = await start_broker(subscriptions_config(tmp_path))
    with trio.fail_after(TIMEOUT):
        async with (
            broker.connect() as client,
            client.consumer("orders.>", subscription="solo", type="exclusive"),
        ):
            with pytest.raises(broky.ConsumerRefused) as refused:
                async with client.consumer("orders.>", subscription="solo", type="exclusive"):
                    pytest.fail("a second exclusive consumer must be refused")
            assert refused.value.code is ErrorCode.SUBSCRIPTION_REFUSED
            assert "exclusive" in refused.value.reason


async def test_broky_sub_prints_and_acks_against_a_real_broker(
    tmp_path: Path, start_broker: StartBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = await start_broker(subscriptions_config(tmp_path))
    address = address_of(broker)
    args = build_parser().parse_args(
        ["sub", "orders.>", "--subscription", "cli", "--start", "earliest", "--count", "5",
         "--address", address]
    )  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with broker.connect() as client:
            await _publish(client, 5, keys=1)
        await consume(args)
    assert capsys.readouterr().out.splitlines() == [f"[orders.k0] {n}" for n in range(5)]
    [status] = broker.statistics().subscriptions
    assert (status.acked, status.backlog, status.consumers) == (5, 0, 0)


async def test_term_sends_the_message_to_the_dead_letter_topic_with_its_reason(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    broker = await start_broker(subscriptions_config(tmp_path))
    with trio.fail_after(TIMEOUT):
        async with (
            broker.connect() as client,
            client.consumer("orders.>", subscription="billing", start=Start.earliest()) as consumer,
        ):
            await _publish(client, 1)
            poison = await anext(consumer)
            await poison.term("cannot parse")
            await consumer.flush()
            async with client.subscribe("_dlq.billing.>", start=Start.earliest()) as letters:
                letter = await anext(letters)
    assert (letter.key, letter.payload) == ("_dlq.billing.orders", b"0")
    tags = dict(letter.tags)
    assert (tags["dlq.topic"], tags["dlq.error"]) == ("orders", "cannot parse")
    assert (int(tags["dlq.partition"]), int(tags["dlq.offset"])) == (
        poison.partition,
        poison.offset,
    )
    [status] = broker.statistics().subscriptions
    assert (status.dead_lettered, status.backlog, status.in_flight) == (1, 0, 0)


async def test_failover_serves_the_higher_priority_then_the_standby_from_the_first_unacked(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    broker = await start_broker(subscriptions_config(tmp_path))
    address = address_of(broker)
    earliest = Start.earliest()
    with trio.fail_after(TIMEOUT):
        async with (
            broky.connect(address) as standby_client,
            standby_client.consumer(
                "orders.>", subscription="fo", type="failover", start=earliest, priority=0
            ) as standby,
        ):
            async with (
                broky.connect(address) as active_client,
                active_client.consumer(
                    "orders.>", subscription="fo", type="failover", start=earliest, priority=5
                ) as active,
            ):
                await _publish(active_client, 20, keys=1)  # one key: one partition, in order
                taken = [await anext(active) for _ in range(20)]
                await active.settle_all(taken[:12])
                await active.flush()
                assert standby.statistics().buffered_messages == 0
            # The active consumer left holding 8 unacked: the standby takes over there.
            rest = [await anext(standby) for _ in range(8)]
            await standby.settle_all(rest)
            await standby.flush()
    assert [int(d.payload) for d in taken] == list(range(20))
    assert [int(d.payload) for d in rest] == list(range(12, 20))
    [status] = broker.statistics().subscriptions
    assert (status.acked, status.backlog, status.in_flight) == (20, 0, 0)


async def test_one_consumer_over_two_durable_topics_acks_every_message(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    """Deliveries of two topics interleave on one stream: each first
    delivery must carry its topic, else its ack names no topic and the
    broker refuses it (``UnknownTopic``), ending the consumer."""
    config = Config.from_mapping(
        {
            "port": 0,
            "data_dir": str(tmp_path),
            "durable": [
                {"name": "east", "pattern": "shop.east.>", "partitions": 2},
                {"name": "west", "pattern": "shop.west.>", "partitions": 2},
            ],
        }
    )
    broker = await start_broker(config)
    count = 300
    taken: list[Delivery] = []
    with trio.fail_after(TIMEOUT):
        async with (
            broker.connect() as client,
            client.consumer(
                "shop.>", subscription="both", start=Start.earliest(), credit=32
            ) as consumer,
        ):
            for number in range(count):
                side = ("east", "west")[number % 2]
                await client.publish(f"shop.{side}.k{number % 5}", b"%d" % number, ack=True)
            await client.flush_acks()
            batches = consumer.batches(16)
            while len(taken) < count:
                batch = await anext(batches)
                taken.extend(batch)
                await consumer.settle_all(batch)
            await consumer.flush()
            assert consumer.statistics().unreceipted_frames == 0
    assert sorted(int(d.payload) for d in taken) == list(range(count))
    assert all(d.topic == d.key.split(".")[1] for d in taken)
    statuses = broker.statistics().subscriptions
    assert sum(s.acked for s in statuses) == count
    assert all((s.backlog, s.in_flight) == (0, 0) for s in statuses)
