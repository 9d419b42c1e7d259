"""Failover takeover, key-shared order under churn, redelivery after a
disconnect or an ack timeout, stall advisories, restarts, and the refusal
on a worker that does not own the partitions: real sockets, a real broker."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import trio

from broky import Broker, Client, Config
from broky.durable import consumer_relays
from broky.protocol.constants import ErrorCode, SettleKind, StartKind, SubscriptionKind
from broky.protocol.frames import Error, Subscribed
from tests.conftest import StartBroker
from tests.subscriptions.test_consume import numbers, publish
from tests.subscriptions.wire import Consumer, Delivery, connect, subscriptions_config

TIMEOUT = 20


async def test_failover_standby_takes_over_from_the_first_unacked(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path, partitions=1))
        assert broker.address is not None
        kind = SubscriptionKind.FAILOVER
        async with broker.connect() as client, connect(broker.address) as b:
            standby = Consumer(b)
            async with connect(broker.address) as a:
                active = Consumer(a)
                assert isinstance(await active.consume("fo", kind=kind), Subscribed)
                assert isinstance(await standby.consume("fo", kind=kind), Subscribed)
                await publish(client, 10)
                got = await active.take(10)
                assert numbers(got) == list(range(10))
                sequence = await active.settle(got[:4], receipt=True)
                await active.receipt(sequence)
            # The active consumer's connection is gone with 6 unacked: the
            # standby gets them at once, in order, as redeliveries.
            taken = await standby.take(6)
            assert numbers(taken) == list(range(4, 10))
            assert all(d.count == 2 for d in taken)


async def test_a_disconnected_consumers_messages_go_to_another_at_once(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with broker.connect() as client, connect(broker.address) as b:
            other = Consumer(b)
            async with connect(broker.address) as a:
                leaving = Consumer(a)
                assert isinstance(await leaving.consume("jobs", credit=5), Subscribed)
                await publish(client, 5)
                held = await leaving.take(5)
                assert isinstance(await other.consume("jobs", credit=100), Subscribed)
            started = trio.current_time()
            again = await other.take(5)
            assert sorted(numbers(again)) == sorted(numbers(held))
            assert all(d.count == 2 for d in again)
            assert trio.current_time() - started < 1.0  # not the 30 s ack timeout


async def test_an_unacked_message_comes_back_after_the_ack_timeout(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with broker.connect() as client, connect(broker.address) as a:
            consumer = Consumer(a)
            subscribed = await consumer.consume("slow", ack_timeout_ms=300, backoff_ms=(0,))
            assert isinstance(subscribed, Subscribed)
            await publish(client, 1)
            [first] = await consumer.take(1)
            started = trio.current_time()
            [second] = await consumer.take(1)
            waited = trio.current_time() - started
            assert (first.offset, first.count, second.offset, second.count) == (
                first.offset,
                1,
                first.offset,
                2,
            )
            assert 0.25 < waited < 1.5
            # A stale in-progress from before changes nothing; an ack settles it.
            sequence = await consumer.settle([second], receipt=True)
            assert (await consumer.receipt(sequence)).stale == 0


async def test_key_shared_keeps_per_key_order_while_consumers_join_and_leave(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    """Per key, first deliveries arrive in publish order across consumers,
    and a consumer sees a key's messages go backwards only as redeliveries
    (a rewind); a consumer that leaves mid-stream hands its keys over and
    nothing stalls: every message is acked."""
    total = 600
    keys = 24
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        address = broker.address
        kind = SubscriptionKind.KEY_SHARED
        # Per key, deliveries in the order the consumers saw them.
        seen: dict[str, list[tuple[str, Delivery]]] = defaultdict(list)
        acked: set[int] = set()
        done = trio.Event()

        async def consume(
            name: str,
            stop: trio.Event | None,
            *,
            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            async with connect(address, name) as raw:
                consumer = Consumer(raw)
                subscribed = await consumer.consume(
                    "ks", kind=kind, start=StartKind.EARLIEST, credit=50, ack_timeout_ms=2000
                )
                assert isinstance(subscribed, Subscribed)
                task_status.started()
                while not done.is_set() and not (stop is not None and stop.is_set()):
                    deliveries = []
                    with trio.move_on_after(0.05):  # a cancelled read loses no bytes
                        deliveries = await consumer.next()
                    for delivery in deliveries:
                        seen[delivery.key].append((name, delivery))
                    acked.update(int(d.payload) for d in deliveries)
                    if deliveries:
                        await consumer.settle(deliveries)
                        await consumer.flow(len(deliveries))

        async with broker.connect() as client, trio.open_nursery() as nursery:
            leave = trio.Event()
            await nursery.start(consume, "stays", None)
            await nursery.start(consume, "leaves", leave)
            for batch in range(0, total, 20):
                if batch == total // 3:
                    await nursery.start(consume, "joins", None)
                if batch == 2 * total // 3:
                    leave.set()
                for index in range(batch, batch + 20):
                    await client.publish(f"orders.k{index % keys}", str(index).encode(), ack=True)
                await client.flush_acks()
                await trio.sleep(0.01)
            while len(acked) < total:  # noqa: ASYNC110 - the checker polls its own record
                await trio.sleep(0.02)
            done.set()
        for key, deliveries in seen.items():
            first_deliveries = [int(d.payload) for _, d in deliveries if d.count == 1]
            assert first_deliveries == sorted(first_deliveries), key
            last: dict[str, int] = {}
            for name, delivery in deliveries:
                number = int(delivery.payload)
                assert number > last.get(name, -1) or delivery.count > 1, (key, name, number)
                last[name] = number
        assert len(acked) == total


async def test_a_stall_on_max_in_flight_is_advised_and_so_is_its_end(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with (
            broker.connect() as client,
            client.subscription("$SYS.events.subscription.>") as events,
            connect(broker.address) as a,
        ):
            await client.flush()
            consumer = Consumer(a)
            assert isinstance(await consumer.consume("capped", max_in_flight=5), Subscribed)
            await publish(client, 20)
            held = await consumer.take(5)
            started = trio.current_time()
            stalled = await next_event(events)
            assert stalled["kind"] == "subscription.stalled"
            assert (stalled["subscription"], stalled["reason"]) == ("capped", "max_in_flight")
            assert trio.current_time() - started < 1.6
            await consumer.settle(held)
            resumed = await next_event(events)
            assert (resumed["kind"], resumed["reason"]) == ("subscription.resumed", "max_in_flight")


async def next_event(events: object) -> dict[str, object]:
    async for message in events:  # type: ignore[attr-defined]
        payload: dict[str, object] = json.loads(message.payload)
        return payload
    raise AssertionError("the advisory subscription ended")


async def test_subscriptions_and_their_acks_survive_a_restart(tmp_path: Path) -> None:
    config = subscriptions_config(tmp_path)
    unacked: list[int] = []
    with trio.fail_after(TIMEOUT):
        for round_number in range(2):
            async with trio.open_nursery() as nursery:
                broker = Broker(config)
                await nursery.start(broker.serve)
                assert broker.address is not None
                if round_number == 1:
                    # Kept with no consumer: what was not acked is still there.
                    [status] = broker.statistics().subscriptions
                    assert (status.name, status.backlog) == ("kept", len(unacked))
                async with broker.connect() as client, connect(broker.address) as a:
                    consumer = Consumer(a)
                    answer = await consumer.consume("kept", start=StartKind.EARLIEST)
                    assert isinstance(answer, Subscribed)
                    if round_number == 0:
                        await publish(client, 10)
                        got = await consumer.take(10)
                        sequence = await consumer.settle(got[:6], receipt=True)
                        await consumer.receipt(sequence)
                        unacked = sorted(numbers(got[6:]))
                    else:
                        got = await consumer.take(4)
                        assert sorted(numbers(got)) == unacked
                        # Delivered once before; a restart may add one (the
                        # tracker's crash rule: never under-count).
                        assert all(d.count in (2, 3) for d in got)
                nursery.cancel_scope.cancel()


async def test_a_consumer_over_an_unreachable_owners_partitions_is_refused_retriably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 0 of two, alone: the owner of the other partitions is not
    there. The attach waits for it (the re-attach window, shortened here),
    then is refused with OwnerUnavailable (consume again)."""
    monkeypatch.setattr(consumer_relays, "REATTACH_SECONDS", 0.5)
    config = subscriptions_config(tmp_path, partitions=4)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(config, worker=0, workers=2)
            await nursery.start(broker.serve)
            assert broker.address is not None
            async with connect(broker.address) as a:
                refused = await Consumer(a).consume("spread")
                assert isinstance(refused, Error)
                assert refused.code == ErrorCode.OWNER_UNAVAILABLE
                assert "worker 1" in refused.message
                assert "did not come back within 0.5 s" in refused.message
            nursery.cancel_scope.cancel()


async def test_term_dead_letters_at_once(tmp_path: Path, start_broker: StartBroker) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with (
            broker.connect() as client,
            client.subscription("_dlq.>") as dead,
            connect(broker.address) as a,
        ):
            await client.flush()
            consumer: Consumer = Consumer(a)
            assert isinstance(await consumer.consume("t"), Subscribed)
            await publish_one(client)
            [delivery] = await consumer.take(1)
            await consumer.settle([delivery], SettleKind.TERM, reason="bad schema")
            message = await anext(dead)
            tags = dict(message.tags)
            assert (tags["dlq.error"], tags["dlq.deliveries"]) == ("bad schema", "1")
            assert tags["dlq.offset"] == str(delivery.offset)
            assert message.key == "_dlq.t.orders"


async def publish_one(client: Client) -> None:
    await publish(client, 1)


async def test_a_consumer_out_of_credit_is_a_no_credit_stall(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with (
            broker.connect() as client,
            client.subscription("$SYS.events.subscription.>") as events,
            connect(broker.address) as a,
        ):
            await client.flush()
            consumer = Consumer(a)
            assert isinstance(await consumer.consume("thirsty", credit=3), Subscribed)
            await publish(client, 10)
            await consumer.settle(await consumer.take(3))
            stalled = await next_event(events)
            assert (stalled["kind"], stalled["reason"]) == ("subscription.stalled", "no_credit")
            await consumer.flow(7)
            assert len(await consumer.take(7)) == 7
            resumed = await next_event(events)
            assert resumed["kind"] == "subscription.resumed"
        [status] = broker.statistics().subscriptions
        assert status.stalled == ""


async def test_a_nack_without_delay_waits_for_the_backoff(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path))
        assert broker.address is not None
        async with (
            broker.connect() as client,
            client.subscription("$SYS.events.subscription.dead_lettered") as events,
            connect(broker.address) as a,
        ):
            await client.flush()
            consumer = Consumer(a)
            subscribed = await consumer.consume("backoff", max_deliveries=3, backoff_ms=(150, 300))
            assert isinstance(subscribed, Subscribed)
            await publish(client, 1)
            waits = []
            [delivery] = await consumer.take(1)
            for _ in range(2):
                await consumer.settle([delivery], SettleKind.NACK)
                started = trio.current_time()
                [delivery] = await consumer.take(1)
                waits.append(trio.current_time() - started)
            # Within 20 % (plus scheduling) of the schedule: 150 ms, then 300 ms.
            assert 0.12 <= waits[0] < 0.3
            assert 0.24 <= waits[1] < 0.5
            await consumer.settle([delivery], SettleKind.NACK, reason="still bad")
            advisory = await next_event(events)
            assert (advisory["subscription"], advisory["deliveries"]) == ("backoff", 3)
            assert advisory["error"] == "still bad"


async def test_a_redelivery_waiting_for_credit_does_not_spin_the_driver(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path, partitions=1))
        assert broker.address is not None
        assert broker.subscriptions is not None
        async with broker.connect() as client, connect(broker.address) as a:
            consumer = Consumer(a)
            kind = SubscriptionKind.EXCLUSIVE
            assert isinstance(await consumer.consume("tight", kind=kind, credit=2), Subscribed)
            await publish(client, 3)
            held = await consumer.take(2)
            partition = broker.subscriptions.partitions[("orders", 0)]
            rounds = 0
            real_round = partition._round

            async def counted() -> None:
                nonlocal rounds
                rounds += 1
                await real_round()

            partition._round = counted  # type: ignore[method-assign]
            # Due at once, but the consumer has no credit left: it waits.
            await consumer.settle(held[1:], SettleKind.NACK, delay_ms=0)
            await trio.sleep(0.5)
            assert rounds < 20
            await consumer.flow(1)
            [again] = await consumer.take(1)
            assert (again.offset, again.count) == (held[1].offset, 2)


async def test_failover_actives_spread_over_consumers_across_eight_partitions(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    """Three failover consumers of an 8-partition topic each get whole
    partitions (one consumer per partition), and every one of them gets some."""
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path, partitions=8))
        assert broker.address is not None
        kind = SubscriptionKind.FAILOVER
        async with (
            broker.connect() as client,
            connect(broker.address) as a,
            connect(broker.address) as b,
            connect(broker.address) as c,
        ):
            consumers = [Consumer(a), Consumer(b), Consumer(c)]
            for consumer in consumers:
                assert isinstance(await consumer.consume("fo8", kind=kind), Subscribed)
            await publish(client, 64, keys=64)
            got = [await consumer.take_all(0.5) for consumer in consumers]
            assert sorted(n for taken in got for n in numbers(taken)) == list(range(64))
            owners = [{d.partition for d in taken} for taken in got]
            assert all(owners), f"a consumer got no partition: {owners}"
            every = set().union(*owners)
            assert len(every) >= 6  # 64 keys hash to (nearly) every partition
            assert sum(len(partitions) for partitions in owners) == len(every)  # one owner each


def two_topics_config(tmp_path: Path) -> Config:
    return Config.from_mapping(
        {
            "port": 0,
            "data_dir": str(tmp_path),
            "durable": [
                {"name": "orders", "pattern": "orders.>", "partitions": 2},
                {"name": "poison", "pattern": "poison.*.>", "partitions": 1},
            ],
        }
    )


async def test_dead_letters_go_to_the_topic_chosen_at_creation(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(two_topics_config(tmp_path))
        assert broker.address is not None
        async with (
            broker.connect() as client,
            client.subscription("poison.>") as dead,
            client.subscription("_dlq.>") as default_dead,
            connect(broker.address) as a,
            connect(broker.address) as b,
        ):
            await client.flush()
            consumer = Consumer(a)
            subscribed = await consumer.consume("billing", dead_letter_topic="poison")
            assert isinstance(subscribed, Subscribed)
            # A later consumer naming another topic is refused; naming none joins.
            other = Consumer(b)
            refused = await other.consume("billing", dead_letter_topic="_dlq")
            assert isinstance(refused, Error)
            assert "fixed at creation" in refused.message
            await publish_one(client)
            [delivery] = await consumer.take(1)
            await consumer.settle([delivery], SettleKind.TERM, reason="bad schema")
            message = await anext(dead)
            assert message.key == "poison.billing.orders"  # poison.*.> filled in
            assert dict(message.tags)["dlq.error"] == "bad schema"
            with trio.move_on_after(0.3):
                await anext(default_dead)
                raise AssertionError("a dead letter reached the default _dlq topic")


async def test_a_dead_letter_topic_must_be_a_durable_topic_the_subscription_does_not_read(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(two_topics_config(tmp_path))
        assert broker.address is not None
        async with connect(broker.address) as a:
            consumer = Consumer(a)
            for topic, words in (("nope", "not a durable topic"), ("orders", "own pattern")):
                refused = await consumer.consume("s", dead_letter_topic=topic)
                assert isinstance(refused, Error), topic
                assert refused.code == ErrorCode.SUBSCRIPTION_REFUSED
                assert words in refused.message
                assert repr(topic) in refused.message


async def test_a_receipt_counts_settled_offsets_never_read_as_unconfirmed(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    """Offsets the broker has not read since it started (a delivery from
    before an owner's restart) cannot be acked: the receipt says so."""
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(subscriptions_config(tmp_path, partitions=1))
        assert broker.address is not None
        async with broker.connect() as client, connect(broker.address) as a:
            consumer = Consumer(a)
            assert isinstance(await consumer.consume("u", start=StartKind.EARLIEST), Subscribed)
            await publish(client, 3)
            got = await consumer.take(3)
            beyond = [Delivery(0, 100 + n, 1, "orders.k", b"", b"", ()) for n in range(5)]
            settled = await consumer.receipt(await consumer.settle(got + beyond, receipt=True))
            assert (settled.stale, settled.unconfirmed) == (0, 5)
