"""The TLS listener: TLS and mTLS connect, pub/sub over TLS, plain peers refused fast.

Certificates come from a throwaway CA made per test by ``trustme``.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trustme

import broky
from broky import Broker, Config
from broky.security.tls import client_context
from tests.conftest import StartBroker, address_of, eventually
from tests.security.helpers import connect_fails


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server_files(ca: trustme.CA, tmp_path: Path) -> dict[str, str]:
    """The broker's certificate chain and key, and the CA, as PEM files."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "server.pem", tmp_path / "key.pem"
    ca_path = tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca.cert_pem.write_to_path(str(ca_path))
    return {"tls_cert": str(cert_path), "tls_key": str(key_path), "ca": str(ca_path)}


def _client_context(ca: trustme.CA, *, with_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    ca.configure_trust(context)
    if with_cert:
        ca.issue_cert("client@example.test").configure_cert(context)
    return context


async def _tls_broker(
    start_broker: StartBroker, files: dict[str, str], *, mtls: bool = False
) -> Broker:
    return await start_broker(
        Config(
            port=0,
            tls_cert=files["tls_cert"],
            tls_key=files["tls_key"],
            tls_client_ca=files["ca"] if mtls else "",
            handshake_timeout=2.0,
        )
    )


async def test_pub_sub_over_tls(start_broker: StartBroker, server_files: dict[str, str]) -> None:
    broker = await _tls_broker(start_broker, server_files)
    context = client_context(ca=server_files["ca"])
    with trio.fail_after(10):
        async with (
            broky.connect(address_of(broker), ssl_context=context) as client,
            client.subscription("tls.>") as subscription,
        ):
            await client.publish("tls.hello", b"over TLS")
            await client.flush()
            message = await subscription.__anext__()
            assert (message.key, message.payload) == ("tls.hello", b"over TLS")


async def test_mtls_accepts_a_client_certificate_signed_by_the_ca(
    start_broker: StartBroker, server_files: dict[str, str], ca: trustme.CA
) -> None:
    broker = await _tls_broker(start_broker, server_files, mtls=True)
    with trio.fail_after(10):
        context = _client_context(ca, with_cert=True)
        async with broky.connect(address_of(broker), ssl_context=context) as client:
            await client.publish("mtls.ok", b"x")
            await client.flush()


async def test_mtls_rejects_a_client_without_a_certificate(
    start_broker: StartBroker, server_files: dict[str, str], ca: trustme.CA
) -> None:
    broker = await _tls_broker(start_broker, server_files, mtls=True)
    with trio.fail_after(5):
        # TLS 1.3 reports the refusal after the client's handshake ends, on
        # the first read (as an SSL error or EOF): the connect fails either way.
        message = await connect_fails(address_of(broker), _client_context(ca))
        assert "requires a client certificate" in message
        assert "client_context(ca=..., cert=..., key=...)" in message
        await eventually(lambda: not broker.statistics().connections_current)
    assert broker.statistics().connections_closed == {"protocol_error": 1}


async def test_plain_client_on_the_tls_port_fails_fast(
    start_broker: StartBroker, server_files: dict[str, str]
) -> None:
    broker = await _tls_broker(start_broker, server_files)
    with trio.fail_after(1.5):
        assert "TLS-only port" in await connect_fails(address_of(broker), None)
        await eventually(lambda: not broker.statistics().connections_current)
    assert broker.statistics().connections_closed == {"protocol_error": 1}


async def test_tls_client_on_the_plain_port_fails_fast(
    broker: Broker, server_files: dict[str, str]
) -> None:
    context = client_context(ca=server_files["ca"])
    with trio.fail_after(1):
        message = await connect_fails(address_of(broker), context)
        assert "TLS handshake with" in message
        assert "HANDSHAKE_FAILURE" in message.upper().replace(" ", "_")
        await eventually(lambda: not broker.statistics().connections_current)
    assert broker.statistics().connections_closed == {"protocol_error": 1}


def test_tls_settings_go_together(server_files: dict[str, str]) -> None:
    with pytest.raises(broky.ConfigError, match="tls_cert and tls_key"):
        Config(tls_cert=server_files["tls_cert"])
    with pytest.raises(broky.ConfigError, match="tls_client_ca needs"):
        Config(tls_client_ca=server_files["ca"])
    with pytest.raises(broky.ConfigError, match="tls_cert: no such file"):
        Config(tls_cert="/nonexistent.pem", tls_key="/nonexistent.pem").tls_context()
