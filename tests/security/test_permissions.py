"""Authorization over real sockets: the allow/deny matrix, deny wins, $SYS, durable reads.

A denied publish or subscribe is a stream error: the connection stays up and
what was allowed goes through.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import broky
from broky import Broker, BrokyError, Config, ErrorCode, PublishRefused
from broky.durable.config import parse_policies
from broky.protocol.frames import Publish, PublishAck
from broky.security.auth import parse_users
from broky.security.passwords import hash_secret
from tests.conftest import StartBroker, address_of, raw_connection

APP = {
    "name": "app",
    "password_hash": hash_secret("app-pw", log_n=10),
    "publish": ["orders.>", "audit.*"],
    "publish_deny": ["orders.secret.>"],
    "subscribe": ["orders.>", "public.*"],
    "subscribe_deny": ["orders.secret.>"],
}
OPS = {
    "name": "ops",
    "password_hash": hash_secret("ops-pw", log_n=10),
    "publish": [],
    "subscribe": [">", "$SYS.>"],
}


@pytest.fixture
async def secured(start_broker: StartBroker, tmp_path: Path) -> Broker:
    """A broker with app and ops users and two durable topics."""
    return await start_broker(
        Config(
            port=0,
            users=parse_users([APP, OPS]),
            data_dir=str(tmp_path),
            durable=parse_policies(
                [
                    {"name": "orders", "pattern": "orders.eu.>", "fsync": "never"},
                    {"name": "payroll", "pattern": "payroll.>", "fsync": "never"},
                ]
            ),
            system_metrics_interval=0.05,
        )
    )


@pytest.mark.parametrize(
    ("pattern", "allowed"),
    [
        ("orders.eu", True),
        ("orders.*", True),
        ("orders.eu.>", True),
        ("public.news", True),
        ("public.*", True),
        ("orders.>", False),  # overlaps the denied orders.secret.>
        ("orders.secret.plans", False),  # denied outright
        ("*.secret.plans", False),  # overlaps the deny through a wildcard
        ("public.>", False),  # not covered by public.*
        (">", False),
        ("payments.x", False),
        ("$SYS.>", False),  # $SYS needs an explicit grant
    ],
)
async def test_subscribe_matrix(secured: Broker, pattern: str, allowed: bool) -> None:
    with trio.fail_after(10):
        async with broky.connect(address_of(secured), user="app", password="app-pw") as app:
            if allowed:
                async with app.subscription(pattern):
                    pass
            else:
                with pytest.raises(BrokyError) as denied:
                    async with app.subscription(pattern):
                        pass  # pragma: no cover
                assert denied.value.code is ErrorCode.PERMISSION_DENIED
                assert repr(pattern) in str(denied.value)
            # the connection stays up either way
            async with app.subscription("orders.eu.1") as subscription:
                await app.publish("orders.eu.1", b"still here")
                async for message in subscription:
                    assert message.payload == b"still here"
                    break


async def test_denied_publishes_are_refused_and_the_rest_goes_through(secured: Broker) -> None:
    with trio.fail_after(10):
        async with (
            broky.connect(address_of(secured), user="ops", password="ops-pw") as ops,
            ops.subscription(">") as everything,
            broky.connect(address_of(secured), user="app", password="app-pw") as app,
        ):
            await app.publish("orders.us.1", b"allowed-1")
            await app.publish("orders.secret.plan", b"denied: deny wins over orders.>")
            await app.publish("payments.x", b"denied: no allow pattern")
            await app.publish("audit.login", b"allowed-2")
            with pytest.raises(PublishRefused) as refused:
                await app.flush()
            assert refused.value.code is ErrorCode.PERMISSION_DENIED
            assert "'orders.secret.plan'" in str(refused.value)
            await app.flush()  # reported once; the client carries on
            await app.publish("orders.us.2", b"allowed-3")
            await app.flush()
            received = []
            async for message in everything:
                received.append(message.payload)
                if message.payload == b"allowed-3":
                    break
    assert received == [b"allowed-1", b"allowed-2", b"allowed-3"]


async def test_ops_reads_sys_but_a_catch_all_does_not_see_it(secured: Broker) -> None:
    with trio.fail_after(10):
        async with (
            broky.connect(address_of(secured), user="ops", password="ops-pw") as ops,
            ops.subscription("$SYS.metrics") as metrics,
        ):
            async for message in metrics:
                assert message.key == "$SYS.metrics"
                break
            await ops.publish("$SYS.events.fake", b"spoofed advisory")
            with pytest.raises(PublishRefused):
                await ops.flush()


async def test_an_acked_frame_with_a_denied_key_is_refused_whole(secured: Broker) -> None:
    with trio.fail_after(10):
        async with broky.connect(address_of(secured), user="app", password="app-pw") as app:
            await app.publish("orders.eu.1", b"would be stored", ack=True)
            await app.publish("orders.secret.x", b"denied", ack=True)
            with pytest.raises(BrokyError) as refused:
                await app.flush_acks()
            assert refused.value.code is ErrorCode.PERMISSION_DENIED
            assert "nothing of this frame was stored" in str(refused.value)
            partitions = await app.partitions("orders")
            assert [p.end_offset for p in partitions] == [0]  # an ack never lies
            await app.publish("orders.eu.2", b"stored", ack=True)
            acked = await app.flush_acks()
            assert [(run.key, run.first_offset) for run in acked] == [("orders.eu.2", 0)]


async def test_durable_reads_follow_subscribe_permissions(secured: Broker) -> None:
    with trio.fail_after(10):
        async with broky.connect(address_of(secured), user="app", password="app-pw") as app:
            listed = await app.partitions()
            assert {p.topic for p in listed} == {"orders"}  # payroll is hidden
            with pytest.raises(BrokyError) as denied:
                await app.partitions("payroll")
            assert denied.value.code is ErrorCode.PERMISSION_DENIED
            with pytest.raises(BrokyError) as denied:
                await app.fetch("payroll", 0, 0)
            assert denied.value.code is ErrorCode.PERMISSION_DENIED
            assert await app.fetch("orders", 0, 0) == []
        async with broky.connect(address_of(secured), user="ops", password="ops-pw") as ops:
            # ops reads everything, the built-in dead-letter topic too.
            assert {p.topic for p in await ops.partitions()} == {"orders", "payroll", "_dlq"}


async def test_an_empty_acked_frame_is_still_acked(broker: Broker) -> None:
    # The admission checks must not swallow a frame that has nothing to refuse.
    with trio.fail_after(10):
        async with raw_connection(broker) as raw:
            await raw.handshake()
            await raw.send_frame(Publish(stream=1, runs=(), ack=True))
            ack = await raw.receive_frame()
    assert ack == PublishAck(
        stream=1, sequence=1, runs=(), partitions=(), first_offsets=(), last_offsets=()
    )
