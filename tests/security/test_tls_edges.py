"""The TLS listener's edges: a stalled handshake is cut at handshake_timeout
without holding up anyone else, and hand-off workers speak TLS too."""

from __future__ import annotations

import logging
import socket
import ssl
import warnings
from pathlib import Path

import pytest
import trio
import trustme

import broky
from broky import Broker, Config
from broky.protocol.framing import encode_preamble
from broky.security.tls import client_context
from tests.conftest import StartBroker, address_of, eventually, raw_connection
from tests.mesh.test_nodes import nodes, take
from tests.security.helpers import CertFiles, connect_fails, write_cert
from tests.security.test_mismatch import TLS_CLIENT_HELLO

#: Short, so the test is fast; the slack covers scheduling on a busy machine.
HANDSHAKE_TIMEOUT = 0.5
SLACK = 1.0


@pytest.fixture
def files(tmp_path: Path) -> CertFiles:
    return write_cert(trustme.CA(), tmp_path, "server", "127.0.0.1")


async def _round_trip(address: str, files: CertFiles, key: str) -> None:
    async with (
        broky.connect(address, ssl_context=client_context(ca=files.ca)) as client,
        client.subscription(key) as subscription,
    ):
        await client.publish(key, b"still served")
        assert await take(subscription, 1) == [b"still served"]


@pytest.mark.parametrize("first_bytes", [b"", TLS_CLIENT_HELLO[:20]], ids=["silent", "half-hello"])
async def test_a_stalled_tls_handshake_is_closed_at_the_timeout(
    start_broker: StartBroker,
    files: CertFiles,
    caplog: pytest.LogCaptureFixture,
    first_bytes: bytes,
) -> None:
    caplog.set_level(logging.WARNING, logger="broky.connection")
    broker: Broker = await start_broker(
        Config(port=0, tls_cert=files.cert, tls_key=files.key, handshake_timeout=HANDSHAKE_TIMEOUT)
    )
    with trio.fail_after(HANDSHAKE_TIMEOUT + SLACK + 5):
        async with raw_connection(broker) as stalled:
            started = trio.current_time()
            if first_bytes:
                await stalled.send(first_bytes)
            # Meanwhile, other clients connect and are served.
            await _round_trip(address_of(broker), files, "other.client")
            await stalled.wait_closed()
            elapsed = trio.current_time() - started
        await eventually(lambda: broker.statistics().connections_closed.get("idle_timeout") == 1)
    assert HANDSHAKE_TIMEOUT * 0.9 <= elapsed <= HANDSHAKE_TIMEOUT + SLACK
    assert broker.statistics().connections_closed == {"idle_timeout": 1, "client_closed": 1}
    assert any(
        f"closed: idle_timeout (TLS handshake not completed within {HANDSHAKE_TIMEOUT} s)"
        in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.slow
async def test_handoff_workers_serve_tls(files: CertFiles) -> None:
    args = ["--workers", "2", "--accept", "handoff", "--tls-cert", files.cert,
            "--tls-key", files.key]  # fmt: skip
    with nodes() as start, trio.fail_after(30):
        node = start(args)
        context = client_context(ca=files.ca)
        # Hand-off is round-robin: the first subscriber lands on one worker,
        # the second on the other, and the publisher reaches both.
        async with (
            broky.connect(node.address, ssl_context=context) as first,
            broky.connect(node.address, ssl_context=context) as second,
            broky.connect(node.address, ssl_context=context) as publisher,
            first.subscription("handoff.>") as on_first,
            second.subscription("handoff.>") as on_second,
        ):
            payloads = [b"%d" % number for number in range(100)]
            for payload in payloads:
                await publisher.publish("handoff.tls", payload)
            await publisher.flush()
            assert await take(on_first, 100) == payloads
            assert await take(on_second, 100) == payloads
        # A plain client is refused by the hand-off workers too.
        assert "TLS-only port" in await connect_fails(node.address, None)


def _handshake_error(address: tuple[str, int], context: ssl.SSLContext) -> str:
    """Handshake with ``context`` and read once; the error the client saw."""
    with socket.create_connection(address, timeout=10) as sock:
        try:
            with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                tls.sendall(encode_preamble())
                tls.recv(64)
        except (ssl.SSLError, OSError) as exc:
            return str(exc)
    return "no error"


@pytest.mark.parametrize("refused", ["tls-1.1", "no-client-certificate"])
async def test_a_refused_tls_client_reads_the_reason_in_an_alert(
    start_broker: StartBroker, files: CertFiles, refused: str
) -> None:
    # OpenSSL writes the alert that says why; the broker must send it, or
    # the client sees only "EOF occurred in violation of protocol".
    client_ca = files.ca if refused == "no-client-certificate" else ""
    broker = await start_broker(
        Config(port=0, tls_cert=files.cert, tls_key=files.key, tls_client_ca=client_ca)
    )
    context = ssl.create_default_context(cafile=files.ca)
    if refused == "tls-1.1":
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer TLS 1.1 at all
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # deprecated: the point
            context.minimum_version = ssl.TLSVersion.TLSv1_1
            context.maximum_version = ssl.TLSVersion.TLSv1_1
    assert broker.address is not None
    with trio.fail_after(20):
        error = await trio.to_thread.run_sync(_handshake_error, broker.address, context)
    expected = "PROTOCOL_VERSION" if refused == "tls-1.1" else "CERTIFICATE_REQUIRED"
    assert expected in error, error
