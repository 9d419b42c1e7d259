"""Authentication over real sockets: credentials, anonymous policy, links.

Hashes use scrypt cost 2**10 (a few ms) so that the tests stay fast; the
broker treats any cost in range the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import pytest
import trio

import broky
from broky import AuthenticationError, Broker, BrokyError, Config, ErrorCode
from broky.protocol.constants import LinkKind
from broky.security.auth import User, parse_users
from broky.security.passwords import hash_secret, hash_token
from tests.conftest import StartBroker, address_of, eventually, raw_connection

PASSWORD = "correct horse battery staple"
TOKEN = "tok-3f9a1c7e5b2d48e0a6c4"
LINK_TOKEN = "link-token-9e8d7c6b5a"


def users(*extra: Mapping[str, object]) -> tuple[User, ...]:
    """alice (password), svc (token), node-b (link token), and any extra tables."""
    return parse_users(
        [
            {"name": "alice", "password_hash": hash_secret(PASSWORD, log_n=10)},
            {"name": "svc", "token_hash": hash_secret(TOKEN, log_n=10)},
            # A link principal's own subscribe list does not limit its node's interest.
            {
                "name": "node-b",
                "token_hash": hash_secret(LINK_TOKEN, log_n=10),
                "link": True,
                "subscribe": [],
            },
            *extra,
        ]
    )


def principal_of(client: broky.Client) -> str:
    """The principal the broker's Welcome named."""
    assert client.server is not None
    return client.server.principal


class SlowChecks:
    """Counts the authenticator's slow (thread-run) credential checks."""

    def __init__(self, broker: Broker) -> None:
        self.calls = 0
        check = broker.authenticator._check

        def counting(user: str, password: str, token: str) -> object:
            self.calls += 1
            return check(user, password, token)

        broker.authenticator._check = counting  # type: ignore[method-assign,assignment]


@asynccontextmanager
async def round_trip_client(
    broker: Broker, user: str = "", password: str = "", token: str = ""
) -> AsyncIterator[broky.Client]:
    """A client that proved it can publish and receive."""
    async with broky.connect(
        address_of(broker), user=user, password=password, token=token
    ) as client:
        async with client.subscription("check.>") as subscription:
            await client.publish("check.one", b"ping")
            async for message in subscription:
                assert message.payload == b"ping"
                break
        yield client


async def test_password_and_token_logins_name_their_principal(start_broker: StartBroker) -> None:
    broker = await start_broker(Config(port=0, users=users()))
    with trio.fail_after(10):
        async with round_trip_client(broker, user="alice", password=PASSWORD) as alice:
            assert principal_of(alice) == "alice"
        async with round_trip_client(broker, token=TOKEN) as svc:
            assert principal_of(svc) == "svc"


@pytest.mark.parametrize(
    "credentials",
    [
        {"user": "alice", "password": "wrong"},
        {"user": "mallory", "password": PASSWORD},
        {"user": "alice", "password": ""},
        {"token": "not-a-token"},
        {"user": "alice", "password": PASSWORD, "token": TOKEN},
    ],
    ids=["wrong-password", "unknown-user", "empty-password", "wrong-token", "mixed"],
)
async def test_bad_credentials_are_refused_with_one_message(
    start_broker: StartBroker, credentials: dict[str, str]
) -> None:
    broker = await start_broker(Config(port=0, users=users()))
    with trio.fail_after(10):
        with pytest.raises(AuthenticationError) as refused:
            async with broky.connect(
                address_of(broker),
                user=credentials.get("user", ""),
                password=credentials.get("password", ""),
                token=credentials.get("token", ""),
            ):
                pass  # pragma: no cover
        assert refused.value.code is ErrorCode.AUTHENTICATION_FAILED
        # The same text whatever was wrong: a guesser learns nothing about names.
        assert "wrong user, password or token" in str(refused.value)
        assert "broky.connect" in str(refused.value)  # says what to fix
        async with round_trip_client(broker, user="alice", password=PASSWORD):
            pass  # other clients carry on
        await eventually(lambda: "authentication_failed" in broker.statistics().connections_closed)
    assert broker.authenticator.failures == 1


async def test_anonymous_needs_permission_once_users_exist(start_broker: StartBroker) -> None:
    closed = await start_broker(Config(port=0, users=users()))
    with trio.fail_after(10), pytest.raises(AuthenticationError, match="requires credentials"):
        async with broky.connect(address_of(closed)):
            pass  # pragma: no cover

    anonymous = {"name": "anonymous", "publish": ["public.>"], "subscribe": ["public.>"]}
    open_to_some = await start_broker(Config(port=0, users=users(anonymous), allow_anonymous=True))
    with trio.fail_after(10):
        async with broky.connect(address_of(open_to_some)) as guest:
            assert principal_of(guest) == "anonymous"
            async with guest.subscription("public.>"):
                pass
            with pytest.raises(BrokyError) as denied:
                async with guest.subscription("check.>"):
                    pass  # pragma: no cover
            assert denied.value.code is ErrorCode.PERMISSION_DENIED


async def test_a_broker_without_users_is_open_and_ignores_credentials(broker: Broker) -> None:
    with trio.fail_after(10):
        async with round_trip_client(broker, user="whoever", password="anything") as client:
            assert principal_of(client) == ""
        async with round_trip_client(broker):
            pass


async def test_in_process_clients_are_trusted(start_broker: StartBroker) -> None:
    broker = await start_broker(Config(port=0, users=users()))
    with trio.fail_after(10):
        async with broker.connect() as client, client.subscription("$SYS.>"):
            pass  # full access, $SYS included, without credentials


async def test_credentials_are_checked_once_per_fleet(start_broker: StartBroker) -> None:
    broker = await start_broker(Config(port=0, users=users()))
    checks = SlowChecks(broker)
    with trio.fail_after(20):
        for _ in range(5):
            async with broky.connect(address_of(broker), token=TOKEN):
                pass
        for _ in range(3):
            with pytest.raises(AuthenticationError):
                async with broky.connect(address_of(broker), token="guess"):
                    pass  # pragma: no cover
    assert checks.calls == 1 + 3  # successes remembered, every failure pays the slow hash


@pytest.mark.parametrize("slow_token_users", [0, 1], ids=["sha256-only", "with-scrypt-token"])
async def test_generated_tokens_are_found_without_a_slow_hash(
    start_broker: StartBroker, slow_token_users: int
) -> None:
    """200 users with generated (sha256) tokens: a login with any of them is
    a dict lookup, and a wrong token pays a slow hash only for the users
    whose token has an scrypt hash."""
    tokens = [f"generated-{number:03d}-{'x' * 40}" for number in range(200)]
    tables = [
        {"name": f"fleet-{number}", "token_hash": hash_token(token), "publish": [f"f{number}.>"]}
        for number, token in enumerate(tokens)
    ]
    if slow_token_users:
        tables.append({"name": "hand", "token_hash": hash_secret("hand-chosen", log_n=10)})
    broker = await start_broker(Config(port=0, users=parse_users(tables)))
    checks = SlowChecks(broker)
    with trio.fail_after(20):
        async with broky.connect(address_of(broker), token=tokens[137]) as client:
            assert principal_of(client) == "fleet-137"
        with pytest.raises(AuthenticationError, match="wrong user, password or token"):
            async with broky.connect(address_of(broker), token="generated-guess"):
                pass  # pragma: no cover
        if slow_token_users:
            async with broky.connect(address_of(broker), token="hand-chosen") as client:
                assert principal_of(client) == "hand"
    assert checks.calls == 2 * slow_token_users


async def test_a_silent_peer_cannot_hold_a_login_slot(start_broker: StartBroker) -> None:
    broker = await start_broker(Config(port=0, users=users(), handshake_timeout=0.5))
    with trio.fail_after(5):
        async with raw_connection(broker) as silent:
            await silent.wait_closed()
        await eventually(lambda: "idle_timeout" in broker.statistics().connections_closed)


async def cluster_pair(
    start_broker: StartBroker, token: str
) -> tuple[Broker, Broker, broky.Client | None]:
    """Node A requires credentials; node B links to A over TCP with ``token``."""
    a = await start_broker(
        Config(
            port=0,
            users=users({"name": "plain", "token_hash": hash_secret("plain-token", log_n=10)}),
        )
    )
    b = await start_broker(Config(port=0, cluster_token=token))
    host, port = a.address or ("", 0)

    async def connect() -> trio.abc.Stream:
        return await trio.open_tcp_stream(host, port)

    b.add_link(LinkKind.CLUSTER, connect, f"{host}:{port}")
    return a, b, None


async def test_cluster_links_authenticate_with_the_cluster_token(
    start_broker: StartBroker,
) -> None:
    a, b, _ = await cluster_pair(start_broker, LINK_TOKEN)
    with trio.fail_after(10):
        async with (
            broky.connect(address_of(b)) as reader,
            reader.subscription("orders.>") as subscription,
            broky.connect(address_of(a), user="alice", password=PASSWORD) as writer,
        ):
            # B's interest reaches A once the link is up; publish until it flows.
            async def keep_publishing() -> None:
                while True:
                    await writer.publish("orders.1", b"across")
                    await writer.flush()
                    await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_publishing)
                async for message in subscription:
                    assert message.payload == b"across"
                    break
                nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("token", "reason"),
    [("plain-token", "permission_denied"), ("", "authentication_failed")],
    ids=["no-link-grant", "no-token"],
)
async def test_links_without_a_link_grant_are_refused(
    start_broker: StartBroker, token: str, reason: str
) -> None:
    a, _, _ = await cluster_pair(start_broker, token)
    with trio.fail_after(10):
        await eventually(lambda: reason in a.statistics().connections_closed)
    assert a.router.statistics().links == ()
