"""``sub.batches()`` against a real broker: order, credit, drops, ending.

Every message carries its sequence number, so a test sees loss, duplication
and reordering alike.
"""

from __future__ import annotations

import pytest
import trio

import broky
from broky import Broker, Client, Config, Message, Subscription
from tests.conftest import StartBroker, address_of, eventually

COUNT = 2_000


async def _publish(
    client: Client, key: str, count: int, first: int = 0, flush_every: int = 0
) -> None:
    """``count`` numbered messages, every seventh with optional fields, so
    that runs mix both decoding paths; a flush every ``flush_every``."""
    for number in range(first, first + count):
        extra = {"tags": [("n", str(number))], "key_partition": b"p"} if number % 7 == 0 else {}
        await client.publish(key, str(number).encode(), **extra)  # type: ignore[arg-type]
        if flush_every and (number + 1) % flush_every == 0:
            await client.flush()
    await client.flush()


def _numbers(messages: list[Message]) -> list[int]:
    return [int(message.payload) for message in messages]


async def _take(subscription: Subscription, count: int, max_messages: int) -> list[Message]:
    taken: list[Message] = []
    async for batch in subscription.batches(max_messages):
        assert 1 <= len(batch) <= max_messages
        taken += batch
        if len(taken) >= count:
            break
    return taken


async def test_batches_deliver_everything_in_order(broker: Broker, address: str) -> None:
    with trio.fail_after(20):
        async with (
            broky.connect(address) as client,
            client.subscribe("seq.>") as subscription,
        ):
            await _publish(client, "seq.a", COUNT)
            taken = await _take(subscription, COUNT, max_messages=300)
    assert _numbers(taken) == list(range(COUNT))
    assert all(type(message) is Message and message.key == "seq.a" for message in taken)
    assert [message.tags for message in taken[:8:7]] == [(("n", "0"),), (("n", "7"),)]


async def test_batches_return_credit(broker: Broker, address: str) -> None:
    """With a window of 100 messages the broker stops after 100 unless the
    batches consumed hand the credit back."""
    with trio.fail_after(20):
        async with (
            broky.connect(address) as client,
            client.subscribe("credit.>", credit=100) as subscription,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(_publish, client, "credit.x", COUNT)
            taken = await _take(subscription, COUNT, max_messages=30)
    assert _numbers(taken) == list(range(COUNT))
    assert subscription.dropped_by_broker == 0


async def test_drops_are_reported_next_to_batches(start_broker: StartBroker) -> None:
    broker = await start_broker(Config(port=0, outbox_messages=100))
    with trio.fail_after(20):
        async with (
            broky.connect(address_of(broker)) as client,
            client.subscribe("drop.>", credit=10) as subscription,
        ):
            # Nothing consumed meanwhile: the outbox overflows. The broker's
            # Notice follows the messages it kept.
            await _publish(client, "drop.x", COUNT, flush_every=50)
            await eventually(lambda: broker.statistics().router.dropped_slow_consumer > 0)
            taken: list[Message] = []
            batches = subscription.batches()
            while len(taken) + subscription.dropped_by_broker < COUNT:
                taken += await anext(batches)
    numbers = _numbers(taken)
    assert numbers == sorted(set(numbers))
    assert numbers[:10] == list(range(10))  # the credit's worth went out first
    assert len(numbers) + subscription.dropped_by_broker == COUNT
    assert subscription.dropped_by_broker == broker.statistics().router.dropped_slow_consumer
    assert subscription.statistics().dropped_by_broker == subscription.dropped_by_broker


async def test_unsubscribe_during_iteration_ends_after_the_buffer(
    broker: Broker, address: str
) -> None:
    with trio.fail_after(20):
        async with broky.connect(address) as client:
            subscription = await client.subscribe("bye.>")
            await _publish(client, "bye.x", COUNT)
            await eventually(lambda: subscription.statistics().buffered_messages == COUNT)
            taken: list[Message] = []
            async for batch in subscription.batches(max_messages=500):
                if not taken:
                    await subscription.unsubscribe()
                taken += batch
            await _publish(client, "bye.x", 10, first=COUNT)  # not delivered any more
    assert _numbers(taken) == list(range(COUNT))


class ConsumerFailed(Exception):
    """The application's own error, raised while handling a batch."""


async def test_an_exception_in_the_consumer_leaves_the_rest_in_order(
    broker: Broker, address: str
) -> None:
    with trio.fail_after(20):
        async with (
            broky.connect(address) as client,
            client.subscribe("boom.>") as subscription,
        ):
            await _publish(client, "boom.x", COUNT)
            failed: list[Message] = []

            async def consume() -> None:
                nonlocal failed
                async for batch in subscription.batches(max_messages=100):
                    failed = batch
                    raise ConsumerFailed

            with pytest.raises(ConsumerFailed):
                await consume()
            rest = [await anext(subscription)]  # per-message iteration picks up after it
            rest += await _take(subscription, COUNT - len(failed) - 1, max_messages=1000)
    assert 1 <= len(failed) <= 100
    assert _numbers(failed + rest) == list(range(COUNT))
