"""Protocol mismatch on the plain port: TLS, HTTP and garbage are each answered
in a language the peer reads, and closed within a second."""

from __future__ import annotations

import trio

from broky import Broker
from broky.protocol.framing import (
    HTTP_BAD_REQUEST,
    TLS_HANDSHAKE_FAILURE_ALERT,
    encode_preamble,
    foreign_preamble_reply,
)
from tests.conftest import eventually, raw_connection

TLS_CLIENT_HELLO = bytes.fromhex(
    "16030100f8010000f40303" + "5a" * 32 + "20" + "00" * 32 + "0008130213031301c02c"
)


def test_reply_is_chosen_by_what_the_peer_speaks() -> None:
    assert foreign_preamble_reply(TLS_CLIENT_HELLO[:8]) == TLS_HANDSHAKE_FAILURE_ALERT
    assert foreign_preamble_reply(b"GET / HT") == HTTP_BAD_REQUEST
    assert foreign_preamble_reply(b"HTTP/1.1") == HTTP_BAD_REQUEST
    assert foreign_preamble_reply(b"\x00garbage") is None
    assert foreign_preamble_reply(encode_preamble()) is None


def test_tls_alert_is_a_fatal_handshake_failure_record() -> None:
    # content type 21 (alert), version 3.1, length 2, level fatal, handshake_failure
    assert bytes([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x28]) == TLS_HANDSHAKE_FAILURE_ALERT


async def _answer(broker: Broker, first_bytes: bytes) -> bytes:
    """Everything the broker sends back before it closes."""
    received = b""
    async with raw_connection(broker) as raw:
        await raw.send(first_bytes)
        while data := await raw.stream.receive_some(65536):
            received += data
    return received


async def test_tls_client_hello_gets_a_tls_alert(broker: Broker) -> None:
    with trio.fail_after(1):
        assert await _answer(broker, TLS_CLIENT_HELLO) == TLS_HANDSHAKE_FAILURE_ALERT
        await eventually(lambda: not broker.statistics().connections_current)
    assert broker.statistics().connections_closed == {"protocol_error": 1}


async def test_http_request_gets_400_saying_what_the_port_speaks(broker: Broker) -> None:
    with trio.fail_after(1):
        answer = await _answer(broker, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await eventually(lambda: not broker.statistics().connections_current)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"Content-Type: text/plain" in head
    assert b"speaks the Broky protocol" in body
    assert broker.statistics().connections_closed == {"protocol_error": 1}


async def test_garbage_gets_the_broky_preamble_and_an_error(broker: Broker) -> None:
    with trio.fail_after(1):
        answer = await _answer(broker, b"\x00\x01garbage!")
    assert answer.startswith(encode_preamble())
    assert b"did not send the Broky preamble" in answer
