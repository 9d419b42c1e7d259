"""Verified client certificates name principals (``certificate`` in ``[[users]]``).

A certificate's identities are its commonNames and its DNS and email
subjectAltNames. Without credentials in the Hello, an identity that a user's
``certificate`` names makes the connection that user, with that user's
permissions; explicit credentials win; an unmapped certificate is anonymous.
Only the client listener (``tls_client_ca``) maps: a cluster certificate
proves a node, not a user.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import pytest
import trio
import trustme

import broky
from broky import AuthenticationError, Broker, BrokyError, Config, ErrorCode, PublishRefused
from broky.mesh.workers import cluster_listeners
from broky.security.acl import Permissions
from broky.security.auth import (
    TRUSTED,
    AuthConfigError,
    AuthenticationFailed,
    Authenticator,
    Principal,
    parse_users,
)
from broky.security.identity import certificate_identities
from broky.security.passwords import hash_secret
from broky.security.tls import client_context
from tests.conftest import StartBroker, address_of, eventually
from tests.mesh.test_nodes import free_ports
from tests.security.helpers import CertFiles, write_cert

PASSWORD: Final = "alice-password"
SVC: Final = {
    "name": "svc",
    "certificate": "svc.example",
    "publish": ["orders.>"],
    "subscribe": ["orders.>"],
}
ALICE: Final = {
    "name": "alice",
    "password_hash": hash_secret(PASSWORD, log_n=10),
    "publish": ["alice.>"],
    "subscribe": ["alice.>"],
}
SVC_PRINCIPAL: Final = Principal(
    "svc", Permissions(publish=(b"orders.>",), subscribe=(b"orders.>",))
)


# Identities, from getpeercert()'s dict.


def _peercert(subject: tuple[tuple[str, str], ...], san: tuple[tuple[str, str], ...]) -> Any:
    """A getpeercert() dict: one attribute per RDN, as CPython returns it."""
    return {
        "subject": tuple((attribute,) for attribute in subject),
        "issuer": ((("organizationName", "test CA"),),),
        "subjectAltName": san,
    }


@pytest.mark.parametrize(
    ("subject", "san", "identities"),
    [
        ((("commonName", "svc"),), (), ("svc",)),
        ((), (("DNS", "svc.example"),), ("svc.example",)),
        ((), (("email", "ops@example.com"),), ("ops@example.com",)),
        (
            (("organizationName", "Example"), ("commonName", "svc")),
            (("DNS", "svc.example"), ("email", "ops@example.com")),
            ("svc", "svc.example", "ops@example.com"),
        ),
        # IP addresses and URIs name no principal; other subject fields neither.
        (
            (("organizationName", "svc-org"),),
            (("IP Address", "10.0.0.1"), ("URI", "spiffe://example/svc")),
            (),
        ),
        # Listed once, in certificate order.
        ((("commonName", "svc.example"),), (("DNS", "svc.example"),), ("svc.example",)),
        ((("commonName", "a"), ("commonName", "b")), (), ("a", "b")),
    ],
    ids=["cn", "dns", "email", "all", "ignored", "repeated", "two-cns"],
)
def test_identities_are_common_names_then_dns_and_email_names(
    subject: tuple[tuple[str, str], ...],
    san: tuple[tuple[str, str], ...],
    identities: tuple[str, ...],
) -> None:
    assert certificate_identities(_peercert(subject, san)) == identities


@pytest.mark.parametrize("peercert", [None, {}], ids=["none", "unverified"])
def test_no_certificate_has_no_identities(peercert: Any) -> None:
    assert certificate_identities(peercert) == ()


# [[users]] tables.


def test_a_certificate_user_parses_and_round_trips_through_to_table() -> None:
    anonymous = {"name": "anonymous", "publish": []}
    both = {
        "name": "both",
        "certificate": "ops@example.com",
        "password_hash": ALICE["password_hash"],
    }
    users = parse_users([SVC, ALICE, both, anonymous])
    svc = users[0]
    assert (svc.certificate, svc.password, svc.token) == ("svc.example", None, None)
    assert users[1].certificate == ""
    assert users[2].certificate == "ops@example.com"
    assert users[2].password is not None
    # Worker processes get their users as tables: nothing may be lost.
    assert parse_users([user.to_table() for user in users]) == users
    assert "certificate" not in users[1].to_table()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"name": "bob", "certificate": 5},
            r"^users\[1\]\.certificate has the wrong type: 5$",
        ),
        (
            {"name": "bob", "certificate": ["svc.example"]},
            r"^users\[1\]\.certificate has the wrong type: \['svc\.example'\]$",
        ),
        (
            {"name": "bob", "certificate": ""},
            r"^users\[1\]\.certificate must be a certificate identity .*, not ''$",
        ),
        (
            {"name": "bob", "certificate": " bob.example"},
            r"^users\[1\]\.certificate must be a certificate identity .*, not ' bob\.example'$",
        ),
        (
            {"name": "bob", "certificate": "svc.example"},
            r"^users\[1\]\.certificate 'svc\.example' is already users\[0\]'s$",
        ),
        (
            {"name": "bob", "publish": ["bob.>"]},
            r"^users\[1\] \(bob\) needs password_hash, token_hash or certificate$",
        ),
        (
            {"name": "anonymous", "certificate": "guest.example"},
            r"^users\[1\]: the 'anonymous' user .* takes no password_hash, token_hash or "
            r"certificate$",
        ),
    ],
    ids=["int", "list", "empty", "padded", "duplicate", "no-credential", "anonymous"],
)
def test_a_bad_certificate_key_is_named(table: dict[str, Any], message: str) -> None:
    with pytest.raises(AuthConfigError, match=message):
        parse_users([SVC, table])


# The Authenticator (hash_checks: tests/security/conftest.py).


async def test_a_mapped_identity_is_its_user_without_a_hash(hash_checks: list[str]) -> None:
    auth = Authenticator(parse_users([SVC, ALICE]))
    principal = await auth.authenticate("", "", "", ("svc", "svc.example"))
    assert principal == SVC_PRINCIPAL
    assert not principal.may_link  # links still need link = true
    assert hash_checks == []


async def test_explicit_credentials_win_over_the_certificate(hash_checks: list[str]) -> None:
    auth = Authenticator(parse_users([SVC, ALICE]))
    alice = await auth.authenticate("alice", PASSWORD, "", ("svc.example",))
    assert alice.name == "alice"
    with pytest.raises(AuthenticationFailed, match="wrong user, password or token"):
        await auth.authenticate("alice", "wrong", "", ("svc.example",))
    assert hash_checks == [PASSWORD, "wrong"]


async def test_an_unmapped_certificate_is_anonymous() -> None:
    closed = Authenticator(parse_users([SVC, ALICE]))
    with pytest.raises(
        AuthenticationFailed, match=r"credentials .*; the client certificate names no user$"
    ):
        await closed.authenticate("", "", "", ("stranger.example",))
    assert closed.failures == 1
    open_to_guests = Authenticator(parse_users([SVC, ALICE]), allow_anonymous=True)
    guest = await open_to_guests.authenticate("", "", "", ("stranger.example",))
    assert guest == Principal("anonymous", Permissions())
    # Without users nobody is named: everyone is trusted, as before.
    assert await Authenticator(()).authenticate("", "", "", ("svc.example",)) is TRUSTED


async def test_a_certificate_naming_two_users_is_refused() -> None:
    ops = {"name": "ops", "certificate": "ops@example.com"}
    auth = Authenticator(parse_users([SVC, ops]), allow_anonymous=True)
    with pytest.raises(AuthenticationFailed, match="names more than one user"):
        await auth.authenticate("", "", "", ("svc.example", "ops@example.com"))
    assert (await auth.authenticate("", "", "", ("ops@example.com",))).name == "ops"


# Over real mTLS connections (ca and server: tests/security/conftest.py).


def _client(ca: trustme.CA, tmp_path: Path, *identities: str, common_name: str) -> ssl.SSLContext:
    files = write_cert(ca, tmp_path, f"client-{common_name}", *identities, common_name=common_name)
    return client_context(ca=files.ca, cert=files.cert, key=files.key)


@asynccontextmanager
async def _client_as(
    principal: str, broker: Broker, context: ssl.SSLContext, user: str = "", password: str = ""
) -> AsyncIterator[broky.Client]:
    """A client over mTLS that the Welcome says is ``principal``."""
    async with broky.connect(
        address_of(broker), ssl_context=context, user=user, password=password
    ) as client:
        assert client.server is not None
        assert client.server.principal == principal
        yield client


async def _mtls_broker(
    start_broker: StartBroker, server: CertFiles, *users: dict[str, Any]
) -> Broker:
    return await start_broker(
        Config(
            port=0,
            tls_cert=server.cert,
            tls_key=server.key,
            tls_client_ca=server.ca,
            users=parse_users(list(users)),
            handshake_timeout=2.0,
        )
    )


@pytest.mark.parametrize(
    "identity", ["svc", "svc.example", "ops@example.com"], ids=["cn", "dns", "email"]
)
async def test_a_mapped_client_gets_its_users_permissions(
    start_broker: StartBroker, server: CertFiles, ca: trustme.CA, tmp_path: Path, identity: str
) -> None:
    broker = await _mtls_broker(start_broker, server, {**SVC, "certificate": identity}, ALICE)
    context = _client(ca, tmp_path, "svc.example", "ops@example.com", common_name="svc")
    with trio.fail_after(10):
        async with (
            _client_as("svc", broker, context) as client,
            client.subscription("orders.>") as orders,
        ):
            with pytest.raises(BrokyError) as denied:
                async with client.subscription("alice.>"):
                    pass  # pragma: no cover
            assert denied.value.code is ErrorCode.PERMISSION_DENIED
            await client.publish("alice.inbox", b"denied")
            with pytest.raises(PublishRefused) as refused:
                await client.flush()
            assert refused.value.code is ErrorCode.PERMISSION_DENIED
            await client.publish("orders.eu", b"allowed")
            await client.flush()
            message = await orders.__anext__()
            assert (message.key, message.payload) == ("orders.eu", b"allowed")
    assert broker.authenticator.failures == 0


@pytest.fixture
async def secured(start_broker: StartBroker, server: CertFiles) -> Broker:
    """An mTLS broker with svc (certificate svc.example) and alice (password)."""
    return await _mtls_broker(start_broker, server, SVC, ALICE)


async def test_an_unmapped_certificate_is_refused_without_anonymous(
    secured: Broker, ca: trustme.CA, tmp_path: Path
) -> None:
    context = _client(ca, tmp_path, "stranger.example", common_name="stranger")
    with trio.fail_after(10):
        with pytest.raises(AuthenticationError) as refused:
            async with broky.connect(address_of(secured), ssl_context=context):
                pass  # pragma: no cover
        assert refused.value.code is ErrorCode.AUTHENTICATION_FAILED
        assert "the client certificate names no user" in str(refused.value)
        # The same certificate with credentials is alice.
        async with _client_as("alice", secured, context, user="alice", password=PASSWORD):
            pass
        await eventually(lambda: "authentication_failed" in secured.statistics().connections_closed)


async def test_explicit_credentials_over_a_mapped_certificate_win(
    secured: Broker, ca: trustme.CA, tmp_path: Path
) -> None:
    context = _client(ca, tmp_path, "svc.example", common_name="svc")
    with trio.fail_after(10):
        async with _client_as("alice", secured, context, user="alice", password=PASSWORD) as alice:
            with pytest.raises(BrokyError) as denied:
                async with alice.subscription("orders.>"):
                    pass  # pragma: no cover
            assert denied.value.code is ErrorCode.PERMISSION_DENIED
        # Wrong credentials do not fall back to the certificate.
        with pytest.raises(AuthenticationError, match="wrong user, password or token"):
            async with broky.connect(
                address_of(secured), ssl_context=context, user="alice", password="wrong"
            ):
                pass  # pragma: no cover


async def test_the_cluster_listener_does_not_map_certificates(
    nursery: trio.Nursery, ca: trustme.CA, tmp_path: Path
) -> None:
    """A certificate from cluster_tls_ca proves a node: on the cluster port
    it names no user, even one whose ``certificate`` it carries."""
    node = write_cert(ca, tmp_path, "node", "127.0.0.1")
    (port,) = free_ports(1)
    config = Config(
        listen=False,
        cluster_listen=f"127.0.0.1:{port}",
        cluster_tls_cert=node.cert,
        cluster_tls_key=node.key,
        cluster_tls_ca=node.ca,
        users=parse_users([SVC, ALICE]),
        handshake_timeout=2.0,
    )
    broker = Broker(config, link_listeners=await cluster_listeners(config, 0))
    await nursery.start(broker.serve)
    context = _client(ca, tmp_path, "svc.example", common_name="svc")
    with trio.fail_after(10), pytest.raises(AuthenticationError) as refused:
        async with broky.connect(f"127.0.0.1:{port}", ssl_context=context):
            pass  # pragma: no cover
    assert "this broker requires credentials" in str(refused.value)
    assert "the client certificate names no user" not in str(refused.value)
