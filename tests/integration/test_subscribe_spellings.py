"""``client.subscribe`` both ways: awaited, and as an async context manager.

``async with client.subscribe(pattern) as sub`` is the spelling the spec asks
for; ``await client.subscribe(pattern)`` and ``client.subscription(pattern)``
are the older ones, kept. Each is checked against a real broker: messages
arrive once it returns, and the context-manager spellings unsubscribe when
the block ends, however it ends.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

import broky
from broky import Broker, Client, ErrorCode, Subscription
from broky.client.subscription import PendingSubscription
from tests.conftest import eventually


def _subscriptions(broker: Broker) -> Callable[[], int]:
    return lambda: broker.statistics().router.subscriptions


async def _round_trip(client: Client, subscription: Subscription, key: str) -> bytes:
    await client.publish(key, b"hello")
    message = await anext(subscription)
    assert message.key == key
    return message.payload


@pytest.mark.parametrize(
    "spelling", [Client.subscribe, Client.subscription], ids=["subscribe", "subscription"]
)
async def test_async_with_subscribe_unsubscribes_on_exit(
    broker: Broker, address: str, spelling: Callable[..., PendingSubscription]
) -> None:
    subscriptions = _subscriptions(broker)
    with trio.fail_after(5):
        async with broky.connect(address) as client:
            async with spelling(client, "orders.>") as subscription:
                assert subscriptions() == 1
                assert await _round_trip(client, subscription, "orders.eu") == b"hello"
            await eventually(lambda: subscriptions() == 0)
            with pytest.raises(StopAsyncIteration):
                await anext(subscription)


async def test_awaited_subscribe_stays_until_unsubscribed(broker: Broker, address: str) -> None:
    subscriptions = _subscriptions(broker)
    with trio.fail_after(5):
        async with broky.connect(address) as client:
            subscription = await client.subscribe("orders.>")
            assert isinstance(subscription, Subscription)
            assert await _round_trip(client, subscription, "orders.us") == b"hello"
            assert subscriptions() == 1
            await subscription.unsubscribe()
            await eventually(lambda: subscriptions() == 0)


class Mistake(Exception):
    """The caller's own error, raised inside ``async with client.subscribe``."""


async def _fail_inside(client: Client) -> None:
    async with client.subscribe("orders.>"):
        raise Mistake


async def test_an_exception_in_the_block_unsubscribes_and_propagates(
    broker: Broker, address: str
) -> None:
    subscriptions = _subscriptions(broker)
    with trio.fail_after(5):
        async with broky.connect(address) as client:
            with pytest.raises(Mistake):
                await _fail_inside(client)
            await eventually(lambda: subscriptions() == 0)


async def _enter(client: Client, pattern: str) -> None:
    async with client.subscribe(pattern):
        pytest.fail("the broker accepted an invalid pattern")


async def test_a_refused_pattern_raises_on_enter(address: str) -> None:
    with trio.fail_after(5):
        async with broky.connect(address) as client:
            with pytest.raises(broky.SubscriptionError) as caught:
                await _enter(client, "orders.>.eu")
            assert caught.value.code is ErrorCode.INVALID_PATTERN
            async with client.subscribe("orders.ok") as subscription:  # the client still works
                assert await _round_trip(client, subscription, "orders.ok") == b"hello"
