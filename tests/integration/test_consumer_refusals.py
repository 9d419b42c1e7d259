"""A real broker refusing a consumer: the caller catches ConsumerRefused itself.

A broker without durable topics has no durable subscriptions to serve, so
it refuses every ``Consume`` (docs/protocol.md, ``SubscriptionRefused``);
the client raises the documented exception, never a group, and the
connection stays usable.
"""

from __future__ import annotations

import pytest
import trio

import broky
from broky import Broker, ErrorCode


async def test_a_broker_without_durable_topics_refuses_and_the_connection_stays_up(
    broker: Broker, address: str
) -> None:
    with trio.fail_after(10):
        async with broky.connect(address) as client:
            with pytest.raises(broky.ConsumerRefused) as refused:
                async with client.consumer("orders.>", subscription="billing", type="exclusive"):
                    pytest.fail("a refused consumer must not enter its block")
            assert refused.value.code is ErrorCode.SUBSCRIPTION_REFUSED
            assert "billing" in refused.value.reason
            async with client.subscribe("orders.>") as subscription:
                await client.publish("orders.eu", b"still here")
                assert (await anext(subscription)).payload == b"still here"
