"""Per-principal quotas: max_connections and max_ingress_bytes_per_second.

Unit tests for the bucket and the ledger, then real sockets: a user's extra
connection refused with a reason, a throttled publisher slowed but losing
nothing (and not timed out while throttled), other users unaffected.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

import broky
from broky import Broker, BrokyError, Config, ErrorCode
from broky.security.auth import AuthConfigError, parse_users
from broky.security.passwords import hash_secret
from broky.security.quotas import QuotaLedger, Quotas, TokenBucket
from tests.conftest import StartBroker, address_of, eventually
from tests.mesh.test_nodes import take

PASSWORD_HASH = hash_secret("pw", log_n=10)


# --- the bucket and the ledger ---------------------------------------------------------


def test_the_bucket_pauses_for_exactly_the_debt() -> None:
    bucket = TokenBucket(rate=1000, now=0.0)
    assert bucket.charge(600, now=0.0) == 0.0  # a second's burst is allowed
    assert bucket.charge(400, now=0.0) == 0.0
    assert bucket.charge(500, now=0.0) == pytest.approx(0.5)  # 500 bytes owed at 1000/s
    assert bucket.charge(0, now=0.5) == 0.0  # the debt has drained
    assert bucket.charge(0, now=100.0) == 0.0
    assert bucket.level == 1000  # refills to one second's worth, no more


def test_the_ledger_counts_connections_per_name() -> None:
    ledger = QuotaLedger()
    two = Quotas(max_connections=2)
    assert ledger.admit("svc", two) is None
    assert ledger.admit("svc", two) is None
    refusal = ledger.admit("svc", two)
    assert refusal is not None
    assert "'svc' already has 2 connection(s)" in refusal
    assert "max_connections" in refusal
    assert ledger.admit("other", two) is None  # per principal
    ledger.release("svc")
    assert ledger.connections("svc") == 1
    assert ledger.admit("svc", two) is None
    assert ledger.admit("free", Quotas()) is None  # 0: no quota of its own


def test_a_principals_connections_share_one_bucket() -> None:
    ledger = QuotaLedger()
    rate = Quotas(max_ingress_bytes_per_second=1000)
    ledger.admit("svc", rate)
    ledger.admit("svc", rate)
    first = ledger.bucket("svc", rate, 0.0)
    assert first is not None
    assert ledger.bucket("svc", rate, 0.0) is first
    faster = ledger.bucket("svc", Quotas(max_ingress_bytes_per_second=5000), 0.0)
    assert faster is not None
    assert faster is not first  # a reloaded rate starts afresh
    assert faster.rate == 5000
    assert ledger.bucket("svc", Quotas(), 0.0) is None
    ledger.release("svc")
    ledger.release("svc")
    assert ledger.connections("svc") == 0


def test_quota_keys_are_parsed_and_checked() -> None:
    (user,) = parse_users(
        [
            {
                "name": "svc",
                "password_hash": PASSWORD_HASH,
                "max_connections": 3,
                "max_ingress_bytes_per_second": 1_000_000,
            }
        ]
    )
    assert user.quotas == Quotas(3, 1_000_000)
    assert user.principal.quotas == user.quotas
    assert parse_users([user.to_table()]) == (user,)  # what workers receive
    for bad in (-1, True, "10"):
        with pytest.raises(AuthConfigError, match=r"users\[0\]\.max_connections"):
            parse_users([{"name": "svc", "password_hash": PASSWORD_HASH, "max_connections": bad}])


# --- over real sockets -----------------------------------------------------------------


def secured(**quotas: int) -> Config:
    return Config(
        port=0,
        users=parse_users(
            [
                {"name": "svc", "password_hash": PASSWORD_HASH, **quotas},
                {"name": "other", "password_hash": PASSWORD_HASH},
            ]
        ),
        idle_timeout=1.0,
        heartbeat_interval=0.3,
    )


async def test_a_users_extra_connection_is_refused_with_a_reason(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(secured(max_connections=2))
    address = address_of(broker)
    with trio.fail_after(10):
        async with AsyncExitStack() as stack:
            for _ in range(2):
                await stack.enter_async_context(broky.connect(address, user="svc", password="pw"))
            with pytest.raises(BrokyError, match="'svc' already has 2 connection") as refused:
                async with broky.connect(address, user="svc", password="pw"):
                    pass  # pragma: no cover
            assert refused.value.code is ErrorCode.LIMIT_EXCEEDED
            async with broky.connect(address, user="other", password="pw"):
                pass  # other principals are not counted against svc
        # Closed connections are released (once the broker has seen them close).
        await eventually(lambda: broker.quotas.connections("svc") == 0)
        async with broky.connect(address, user="svc", password="pw"):
            pass


async def test_a_throttled_publisher_is_slowed_and_loses_nothing(
    start_broker: StartBroker,
) -> None:
    """50 kB/s with 150 kB to send: at least 2 s. Reads pause for up to
    ~1.3 s per 64 KiB chunk, longer than the 1 s idle timeout: a throttled
    connection must not be closed as idle."""
    broker: Broker = await start_broker(secured(max_ingress_bytes_per_second=50_000))
    address = address_of(broker)
    payloads = [number.to_bytes(4, "big") * 250 for number in range(150)]  # 150 x 1000 B
    with trio.fail_after(20):
        async with (
            broky.connect(address, user="other", password="pw") as reader,
            reader.subscription("data.>") as inbox,
            broky.connect(address, user="svc", password="pw") as svc,
        ):
            started = trio.current_time()
            for payload in payloads:
                await svc.publish("data.x", payload)
            await svc.flush()
            elapsed = trio.current_time() - started
            assert await take(inbox, len(payloads)) == payloads
            # Meanwhile an unthrottled user is served at once.
            await reader.publish("data.y", b"quick")
            await reader.flush()
            assert await take(inbox, 1) == [b"quick"]
    assert elapsed >= 1.8  # (150 kB - 50 kB burst) / 50 kB/s, less timer slack
    assert broker.statistics().connections_closed.get("idle_timeout", 0) == 0
