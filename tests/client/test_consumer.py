"""A durable-subscription consumer against a scripted broker over memory streams.

The broker here is a stand-in built on the server-side ProtocolMachine: it
answers Hello, Consume, Settle and Ping as docs/protocol.md says a broker
does, records every frame the client sends, and lets the test deliver runs.
It checks the client's half of the contract (metadata, batched range acks,
receipts, credit, refusals); tests/integration/test_consume_cli.py runs
``broky sub --subscription`` against it over TCP.
"""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from broky.client.client import Client
from broky.client.cluster_consumer import ClusterConsumer
from broky.client.consumer import CLOSE_RECEIPT_TIMEOUT, Consumer
from broky.client.durable import Start
from broky.client.errors import ConnectionClosed, ConsumerRefused, SubscriptionError
from broky.protocol.constants import ErrorCode, SettleKind, StartKind, SubscriptionKind
from broky.protocol.frames import (
    Consume,
    Deliver,
    Error,
    Flow,
    Redelivered,
    Run,
    Settle,
    Unsubscribe,
)
from broky.protocol.message import encode_message, pack_sizes
from tests.client.scripted_broker import ScriptedBroker


def _run(partition: int, base_offset: int, count: int, key: bytes = b"orders.eu") -> Run:
    blobs = [encode_message(f"m{base_offset + i}".encode()) for i in range(count)]
    stamp = time.time_ns() - 2_000_000_000
    return Run(
        key,
        stamp,
        count,
        pack_sizes([len(b) for b in blobs]),
        b"".join(blobs),
        partition,
        base_offset,
    )


def _ranges(settle: Settle) -> list[tuple[int, int, int]]:
    return list(zip(settle.partitions, settle.first_offsets, settle.last_offsets, strict=True))


async def test_deliveries_carry_metadata_and_acks_travel_as_one_range(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    broker, client = wired
    with trio.fail_after(10):
        async with client.consumer(
            "orders.>", subscription="billing", type="key-shared", ack_interval=60, backoff=(0.1, 1)
        ) as consumer:
            [consume] = broker.of(Consume)
            assert (consume.subscription, consume.pattern, consume.backoff_ms) == (
                "billing",
                b"orders.>",
                (100, 1000),
            )
            await broker.send(Redelivered(consumer.stream, (2,), (103,), (3,), topic="orders"))
            await broker.send(Deliver(consumer.stream, (_run(2, 100, 10),)))
            seen = []
            async for delivery in consumer:
                seen.append(delivery)
                await delivery.ack()
                if len(seen) == 10:
                    break
            assert [d.offset for d in seen] == list(range(100, 110))
            assert {(d.topic, d.partition, d.key) for d in seen} == {("orders", 2, "orders.eu")}
            assert [d.delivery_count for d in seen if d.delivery_count != 1] == [3]
            assert seen[3].retry_count == 2
            assert seen[0].payload == b"m100"
            assert 1.5 < seen[0].age < 60
            assert broker.of(Settle) == []  # batched: nothing sent before the timer or a flush
            await consumer.flush()
            [settle] = broker.of(Settle)
            assert (settle.kind, settle.topic, _ranges(settle)) == (
                SettleKind.ACK,
                "orders",
                [(2, 100, 109)],
            )
            stats = consumer.statistics()
            assert (stats.acked, stats.stale_acks, stats.unreceipted_frames) == (10, 1, 0)
        await broker.wait_for(Unsubscribe)


async def test_nack_term_and_in_progress_keep_their_delay_and_reason(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    broker, client = wired
    with trio.fail_after(10):
        async with client.consumer("orders.>", subscription="s", ack_interval=60) as consumer:
            await broker.send(Deliver(consumer.stream, (_run(0, 0, 4),)))
            batch = await anext(consumer.batches())
            await batch[0].in_progress()
            await batch[0].ack()
            await batch[1].nack()
            await batch[2].nack(delay=2.5)
            await batch[3].term("poison")
            await consumer.flush()
    settles = [(s.kind, s.delay_ms, s.reason, _ranges(s)) for s in broker.of(Settle)]
    assert settles == [
        (SettleKind.IN_PROGRESS, -1, "", [(0, 0, 0)]),
        (SettleKind.ACK, -1, "", [(0, 0, 0)]),
        (SettleKind.NACK, -1, "", [(0, 1, 1)]),
        (SettleKind.NACK, 2500, "", [(0, 2, 2)]),
        (SettleKind.TERM, -1, "poison", [(0, 3, 3)]),
    ]


async def test_acks_go_out_on_the_timer_and_when_the_batch_is_full(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    broker, client = wired
    with trio.fail_after(10):
        async with client.consumer(
            "orders.>", subscription="s", ack_interval=0.01, ack_batch=4
        ) as consumer:
            await broker.send(Deliver(consumer.stream, (_run(1, 0, 6),)))
            batch = await anext(consumer.batches())
            await consumer.settle_all(batch[:4])  # a full batch: sent at once
            assert [_ranges(s) for s in broker.of(Settle)] == []
            [full] = await broker.wait_for(Settle)
            assert _ranges(full) == [(1, 0, 3)]
            await batch[5].ack()  # one ack: sent by the timer, without a flush
            settles = await broker.wait_for(Settle, 2)
            assert _ranges(settles[1]) == [(1, 5, 5)]


async def test_leaving_the_block_sends_pending_acks_and_waits_for_their_receipt(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    broker, client = wired
    with trio.fail_after(10):
        async with client.consumer("orders.>", subscription="s", ack_interval=60) as consumer:
            await broker.send(Deliver(consumer.stream, (_run(0, 7, 1),)))
            await (await anext(consumer)).ack()
        assert consumer.statistics().unreceipted_frames == 0
        [settle] = broker.of(Settle)
        assert _ranges(settle) == [(0, 7, 7)]
        [unsubscribe] = await broker.wait_for(Unsubscribe)
        assert broker.received.index(settle) < broker.received.index(unsubscribe)


async def test_credit_is_granted_back_as_messages_are_taken_and_held_while_paused(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    broker, client = wired
    with trio.fail_after(10):
        async with client.consumer("orders.>", subscription="s", credit=10) as consumer:
            await broker.send(Deliver(consumer.stream, (_run(0, 0, 5),)))
            await anext(consumer.batches())
            [flow] = await broker.wait_for(Flow)
            assert flow == Flow(consumer.stream, 5)
            consumer.pause()
            await broker.send(Deliver(consumer.stream, (_run(0, 5, 5),)))
            await anext(consumer.batches())
            await client.ping()  # every frame the client sent before is at the broker
            assert len(broker.of(Flow)) == 1
            consumer.resume()
            flows = await broker.wait_for(Flow, 2)
            assert flows[1] == Flow(consumer.stream, 5)


async def test_a_refusal_raises_consumer_refused_with_the_brokers_reason(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    broker, client = wired
    broker.refuse = "subscription 'billing' is exclusive and has a consumer"
    with trio.fail_after(10), pytest.raises(ConsumerRefused) as refused:
        async with client.consumer("orders.>", subscription="billing", type="exclusive"):
            pytest.fail("a refused consumer must not enter its block")
    assert refused.value.code is ErrorCode.SUBSCRIPTION_REFUSED
    assert refused.value.reason == broker.refuse
    await client.ping()  # the connection is still usable


async def test_flush_raises_when_the_broker_ends_the_consumer(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    broker, client = wired
    broker.receipts = False
    with trio.fail_after(10):
        async with client.consumer("orders.>", subscription="s") as consumer:
            await broker.send(Deliver(consumer.stream, (_run(0, 0, 1),)))
            delivery = await anext(consumer)
            await delivery.ack()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_end_consumer_once_settled, broker, consumer)
                with pytest.raises(SubscriptionError, match="gone"):
                    await consumer.flush()
            with pytest.raises(SubscriptionError):
                await delivery.ack()
            with pytest.raises(SubscriptionError, match="gone"):
                await anext(consumer)
        # Leaving the block still tells the broker the stream is done.
        await broker.wait_for(Unsubscribe)


async def test_leaving_waits_for_receipts_at_most_close_receipt_timeout(
    wired: tuple[ScriptedBroker, Client], autojump_clock: trio.testing.MockClock
) -> None:
    broker, client = wired
    broker.receipts = False  # a broker that never confirms
    with trio.fail_after(CLOSE_RECEIPT_TIMEOUT + 5):
        async with client.consumer("orders.>", subscription="s") as consumer:
            await broker.send(Deliver(consumer.stream, (_run(0, 0, 1),)))
            await (await anext(consumer)).ack()
            left_at = trio.current_time()
        waited = trio.current_time() - left_at
    assert CLOSE_RECEIPT_TIMEOUT <= waited < CLOSE_RECEIPT_TIMEOUT + 1
    assert consumer.statistics().unreceipted_frames == 1
    await broker.wait_for(Unsubscribe)


async def test_abort_ends_the_consumer_at_once_and_leaving_waits_for_nothing(
    wired: tuple[ScriptedBroker, Client], autojump_clock: trio.testing.MockClock
) -> None:
    """What ClusterConsumer does to a node that stopped answering: leaving
    must not wait CLOSE_RECEIPT_TIMEOUT for receipts that cannot come."""
    broker, client = wired
    broker.receipts = False  # a broker gone silent
    with trio.fail_after(CLOSE_RECEIPT_TIMEOUT + 5):
        async with client.consumer("orders.>", subscription="s") as consumer:
            await broker.send(Deliver(consumer.stream, (_run(0, 0, 1),)))
            await (await anext(consumer)).ack()
            aborted_at = trio.current_time()
            client.abort("the broker went silent")
            with pytest.raises(ConnectionClosed, match="silent"):
                await anext(consumer)
    assert trio.current_time() == aborted_at
    assert client.closed


def test_a_cluster_consumer_wants_a_positive_node_timeout() -> None:
    with pytest.raises(ValueError, match="node_timeout must be positive"):
        ClusterConsumer(["127.0.0.1:1"], "orders.>", "s", "shared", 1.0, "", {}, node_timeout=0)


async def _end_consumer_once_settled(broker: ScriptedBroker, consumer: Consumer) -> None:
    await broker.wait_for(Settle)
    await broker.send(Error(ErrorCode.UNKNOWN_STREAM, "consumer gone", consumer.stream))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"type": "round-robin"}, "type must be one of"),
        ({"subscription": ""}, "subscription must be"),
        ({"ack_timeout": 0}, "ack_timeout must be at least"),
        ({"credit": 0}, "credit must be between"),
        ({"backoff": (-1,)}, "backoff must be between"),
    ],
)
async def test_wrong_options_raise_value_error_before_anything_is_sent(
    wired: tuple[ScriptedBroker, Client], options: dict[str, object], message: str
) -> None:
    broker, client = wired
    arguments: dict[str, object] = {"subscription": "s", **options}
    with pytest.raises(ValueError, match=message):
        client.consumer("orders.>", **arguments)  # type: ignore[arg-type]
    await client.ping()
    assert broker.received == []


async def test_the_callers_exception_leaves_the_block_unchanged_after_the_acks(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    broker, client = wired
    mistake = LookupError("the application's own")

    async def ack_one_then_fail() -> None:
        async with client.consumer("orders.>", subscription="s", ack_interval=60) as consumer:
            await broker.send(Deliver(consumer.stream, (_run(0, 0, 2),)))
            await (await anext(consumer)).ack()
            raise mistake

    with trio.fail_after(10), pytest.raises(LookupError) as raised:
        await ack_one_then_fail()
    assert raised.value is mistake
    [settle] = await broker.wait_for(Settle)
    assert _ranges(settle) == [(0, 0, 0)]


async def test_a_redelivered_frame_names_the_topic_of_the_delivers_after_it(
    wired: tuple[ScriptedBroker, Client],
) -> None:
    """The broker names a stream's topic only when it switches (an empty
    Redelivered if nothing is redelivered): every Deliver after it has that
    topic, and each Settle names the topic of its ranges."""
    broker, client = wired
    with trio.fail_after(10):
        async with client.consumer("shop.>", subscription="s", ack_interval=60) as consumer:
            await broker.send(Deliver(consumer.stream, (_run(0, 1, 1),)))  # before any naming
            await broker.send(Redelivered(consumer.stream, (0,), (5,), (2,), topic="east"))
            await broker.send(Deliver(consumer.stream, (_run(0, 5, 1), _run(1, 9, 1))))
            await broker.send(Deliver(consumer.stream, (_run(0, 6, 1),)))
            await broker.send(Redelivered(consumer.stream, (), (), (), topic="west"))
            await broker.send(Deliver(consumer.stream, (_run(0, 6, 1),)))
            taken = [await anext(consumer) for _ in range(5)]
            await consumer.settle_all(taken)
            await consumer.flush()
    assert [(d.topic, d.partition, d.offset, d.delivery_count) for d in taken] == [
        ("", 0, 1, 1),
        ("east", 0, 5, 2),
        ("east", 1, 9, 1),
        ("east", 0, 6, 1),
        ("west", 0, 6, 1),
    ]
    assert sorted((s.topic, *_ranges(s)) for s in broker.of(Settle)) == [
        ("", (0, 1, 1)),
        ("east", (0, 5, 6), (1, 9, 9)),
        ("west", (0, 6, 6)),
    ]


@pytest.mark.parametrize(
    ("start", "fields"),
    [
        (None, (StartKind.LATEST, 0, ())),
        (Start.earliest(), (StartKind.EARLIEST, 0, ())),
        (Start.offset({1: 42}), (StartKind.OFFSET, 0, (0, 42))),
        (Start.time(1_700_000_000_000_000_000), (StartKind.TIME, 1_700_000_000_000_000_000, ())),
    ],
)
async def test_the_start_position_travels_in_the_consume_frame(
    wired: tuple[ScriptedBroker, Client],
    start: Start | None,
    fields: tuple[StartKind, int, tuple[int, ...]],
) -> None:
    broker, client = wired
    with trio.fail_after(10):
        async with client.consumer(
            "orders.>",
            subscription="s",
            start=start,
            credit=7,
            max_in_flight=9,
            ack_timeout=1.5,
            max_deliveries=3,
            priority=-2,
        ):
            [consume] = broker.of(Consume)
    assert (consume.start, consume.start_time, consume.start_offsets) == fields
    assert (
        consume.credit,
        consume.max_in_flight,
        consume.ack_timeout_ms,
        consume.max_deliveries,
        consume.priority,
        consume.kind,
    ) == (7, 9, 1500, 3, -2, SubscriptionKind.SHARED)
