"""Each limit hit once: the documented outcome, and other clients unaffected.

max_frame_bytes, max_subscriptions_per_connection, the handshake and idle
timeouts and the per-subscription outbox bounds have their own tests (in
tests/integration, tests/faults and tests/router); here are the limits of
issue 6: max_connections, max_message_bytes and max_pending_bytes.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

import broky
from broky import Broker, BrokyError, Config, ErrorCode, LocalProtocolError, PublishRefused
from broky.protocol.constants import SlowConsumerPolicy
from tests.conftest import StartBroker, address_of, eventually


async def assert_serving(broker: Broker) -> None:
    """A fresh client can still publish and receive."""
    async with (
        broky.connect(address_of(broker)) as client,
        client.subscription("alive.>") as subscription,
    ):
        await client.publish("alive.check", b"yes")
        async for message in subscription:
            assert message.payload == b"yes"
            break


async def test_max_connections_refuses_the_next_one_with_a_reason(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(Config(port=0, max_connections=3))
    with trio.fail_after(10):
        async with AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(broky.connect(address_of(broker))) for _ in range(3)
            ]
            with pytest.raises(BrokyError) as refused:
                async with broky.connect(address_of(broker)):
                    pass  # pragma: no cover
            assert refused.value.code is ErrorCode.LIMIT_EXCEEDED
            assert "max_connections" in str(refused.value)
            for client in clients:
                await client.ping()  # the three carry on
        await eventually(lambda: broker.statistics().connections_current == 0)
        await assert_serving(broker)  # a slot freed is a slot reused
    assert broker.statistics().connections_closed.get("limit_exceeded") == 1


async def test_max_message_bytes_is_checked_by_client_and_broker(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(Config(port=0, max_message_bytes=2000))
    with trio.fail_after(10):
        async with (
            broky.connect(address_of(broker)) as client,
            client.subscription("big.>") as subscription,
        ):
            assert client.server is not None
            assert client.server.max_message_bytes == 2000
            with pytest.raises(LocalProtocolError, match="max_message_bytes"):
                await client.publish("big.one", bytes(3000))
            # A client that ignores the Welcome is stopped by the broker.
            client._max_message_bytes = 10**6
            await client.publish("big.one", b"small before")
            await client.flush()
            await client.publish("big.two", bytes(3000))
            with pytest.raises(PublishRefused) as refused:
                await client.flush()
            assert refused.value.code is ErrorCode.LIMIT_EXCEEDED
            assert "exceeds max_message_bytes (2000)" in str(refused.value)
            await client.publish("big.one", b"small after")
            await client.flush()
            payloads = []
            async for message in subscription:
                payloads.append(message.payload)
                if len(payloads) == 2:
                    break
    assert payloads == [b"small before", b"small after"]
    await assert_serving(broker)


@pytest.mark.parametrize("policy", [SlowConsumerPolicy.DROP, SlowConsumerPolicy.DISCONNECT])
async def test_max_pending_bytes_bounds_one_connection_across_subscriptions(
    start_broker: StartBroker, policy: SlowConsumerPolicy
) -> None:
    limit = 300 * 1024
    broker = await start_broker(Config(port=0, outbox_bytes=1024 * 1024, max_pending_bytes=limit))
    count, size = 2000, 1000
    with trio.fail_after(20):
        async with (
            broky.connect(address_of(broker)) as hoarder,
            broky.connect(address_of(broker)) as healthy,
            healthy.subscription("feed.>") as fine,
            broky.connect(address_of(broker)) as publisher,
        ):
            # Three subscriptions that take one message each and then stall
            # (flow-control credit 1, never replenished by reading).
            stalled = [
                await hoarder.subscribe(f"feed.{name}", credit=1, slow_consumer=policy)
                for name in ("a", "a", "a")
            ]
            received = 0

            async def read_all() -> None:
                nonlocal received
                async for _ in fine:
                    received += 1
                    if received == count:
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_all)
                for seq in range(count):
                    await publisher.publish("feed.a", seq.to_bytes(4, "big") + bytes(size))
                    if seq % 100 == 99:  # paced, so that the healthy reader keeps up
                        await publisher.flush()
                        await trio.sleep(0.01)
                await publisher.flush()
            assert received == count  # another connection, unaffected
            statistics = broker.router.statistics()
            # Each subscription alone stays below outbox_bytes; together they
            # hit the cap (which one run may exceed, so that any run can pass).
            assert statistics.outbox_bytes <= limit + 256 * 1024
            if policy is SlowConsumerPolicy.DROP:
                assert statistics.dropped_slow_consumer > 0
                await hoarder.ping()  # still connected
            else:
                await eventually(lambda: "slow_consumer" in broker.statistics().connections_closed)
                with pytest.raises(BrokyError, match="max_pending_bytes"):
                    async for _ in stalled[0]:
                        pass
    await assert_serving(broker)


async def test_max_subscriptions_per_connection_is_a_stream_error(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(Config(port=0, max_subscriptions_per_connection=2))
    with trio.fail_after(10):
        async with broky.connect(address_of(broker)) as client:
            first = await client.subscribe("a.one")
            await client.subscribe("a.two")
            with pytest.raises(BrokyError) as refused:
                await client.subscribe("a.three")
            assert refused.value.code is ErrorCode.LIMIT_EXCEEDED
            assert "at most 2 subscriptions" in str(refused.value)
            await first.unsubscribe()
            await client.subscribe("a.three")  # a freed slot is reusable
    await assert_serving(broker)


async def test_in_process_clients_do_not_count_against_max_connections(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(Config(port=0, max_connections=1))
    with trio.fail_after(10):
        async with broky.connect(address_of(broker)) as network_client:
            async with broker.connect() as embedded:  # trusted, like worker links
                await embedded.ping()
            with pytest.raises(BrokyError, match="max_connections"):
                async with broky.connect(address_of(broker)):
                    pass  # pragma: no cover
            await network_client.ping()
