"""ProtocolMachine: preamble, handshake order and which side may send what."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role, State
from broky.protocol.constants import (
    MAGIC,
    PREAMBLE_SIZE,
    PROTOCOL_VERSION,
    ErrorCode,
    NoticeKind,
)
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    Deliver,
    Error,
    Flow,
    Frame,
    Hello,
    Notice,
    Ping,
    Pong,
    Publish,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Welcome,
)
from broky.protocol.framing import encode_preamble

PREAMBLE = MAGIC + struct.pack("<H", PROTOCOL_VERSION)
MAX_FRAME = 64 * 1024

TO_SERVER_ONLY: list[Frame] = [
    Publish(stream=1, runs=()),
    Subscribe(stream=1, pattern=b"a.>"),
    Unsubscribe(stream=1),
    Flow(stream=1, credit=5),
]
TO_CLIENT_ONLY: list[Frame] = [
    Deliver(stream=1, runs=()),
    Subscribed(stream=1),
    Notice(stream=1, kind=NoticeKind.DROPPED, count=3),
]
EITHER_WAY: list[Frame] = [Ping(nonce=1), Pong(nonce=2), Error(ErrorCode.INTERNAL, "oops", 1)]
HANDSHAKE: dict[Role, Frame] = {Role.SERVER: Hello(client_name="t"), Role.CLIENT: Welcome()}

#: The first bytes a TLS 1.2/1.3 client sends: a handshake record with a ClientHello.
TLS_CLIENT_HELLO = bytes.fromhex("160301020001000200fc03036a9e")


def _id(frame: Frame) -> str:
    return type(frame).__name__


def _open(role: Role) -> ProtocolMachine:
    machine = ProtocolMachine(role, MAX_FRAME)
    assert machine.receive_data(PREAMBLE + encode_frame(HANDSHAKE[role])) == [HANDSHAKE[role]]
    assert machine.state is State.OPEN
    return machine


def _rejected(machine: ProtocolMachine, data: bytes) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        machine.receive_data(data)
    assert machine.state is State.CLOSED
    assert machine.receive_data(PREAMBLE + encode_frame(Ping(nonce=1))) == []
    return info.value


# --- preamble -----------------------------------------------------------------


def test_initiate_sends_the_preamble() -> None:
    machine = ProtocolMachine(Role.CLIENT, MAX_FRAME)
    assert machine.initiate() == encode_preamble() == b"BROKY\x00\x01\x00"
    assert len(machine.initiate()) == PREAMBLE_SIZE


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_preamble_and_handshake_byte_by_byte(role: Role) -> None:
    machine = ProtocolMachine(role, MAX_FRAME)
    data = PREAMBLE + encode_frame(HANDSHAKE[role]) + encode_frame(Ping(nonce=9))
    frames: list[Frame] = []
    states = []
    for index in range(len(data)):
        frames += machine.receive_data(data[index : index + 1])
        states.append(machine.state)
    assert frames == [HANDSHAKE[role], Ping(nonce=9)]
    assert states[PREAMBLE_SIZE - 2] is State.PREAMBLE
    assert states[PREAMBLE_SIZE - 1] is State.HANDSHAKE
    assert states[-1] is State.OPEN


def test_tls_client_hello_is_named() -> None:
    error = _rejected(ProtocolMachine(Role.SERVER, MAX_FRAME), TLS_CLIENT_HELLO)
    assert error.code == ErrorCode.BAD_PREAMBLE
    assert "TLS" in str(error)


@pytest.mark.parametrize(
    "request_line",
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"POST /publish HTTP/1.1\r\n", b"HTTP/1.1 200 OK\r\n"],
)
def test_http_is_named(request_line: bytes) -> None:
    error = _rejected(ProtocolMachine(Role.SERVER, MAX_FRAME), request_line)
    assert error.code == ErrorCode.BAD_PREAMBLE
    assert "HTTP" in str(error)
    assert "TLS" not in str(error)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=PREAMBLE_SIZE, max_size=32).filter(lambda data: data[:6] != MAGIC))
def test_garbage_preamble(garbage: bytes) -> None:
    error = _rejected(ProtocolMachine(Role.SERVER, MAX_FRAME), garbage)
    assert error.code == ErrorCode.BAD_PREAMBLE


def test_garbage_preamble_message_shows_the_bytes() -> None:
    error = _rejected(ProtocolMachine(Role.CLIENT, MAX_FRAME), b"SSH-2.0-OpenSSH_9.6\r\n")
    assert "did not send the Broky preamble" in str(error)
    assert "SSH-2.0-" in str(error)


@pytest.mark.parametrize("version", [0, 2, 0xFFFF])
def test_unsupported_version(version: int) -> None:
    error = _rejected(ProtocolMachine(Role.SERVER, MAX_FRAME), MAGIC + struct.pack("<H", version))
    assert error.code == ErrorCode.UNSUPPORTED_VERSION
    assert f"version {version}" in str(error)


def test_version_is_little_endian() -> None:
    error = _rejected(ProtocolMachine(Role.SERVER, MAX_FRAME), MAGIC + b"\x00\x01")
    assert error.code == ErrorCode.UNSUPPORTED_VERSION
    assert "version 256" in str(error)


# --- handshake ------------------------------------------------------------------


@pytest.mark.parametrize("frame", [*TO_SERVER_ONLY, *EITHER_WAY, Welcome()], ids=_id)
def test_server_requires_hello_first(frame: Frame) -> None:
    machine = ProtocolMachine(Role.SERVER, MAX_FRAME)
    error = _rejected(machine, PREAMBLE + encode_frame(frame) + encode_frame(Hello()))
    assert error.code == ErrorCode.MALFORMED_FRAME
    assert f"expected Hello as the first frame, got {type(frame).__name__}" in str(error)


@pytest.mark.parametrize("frame", [*TO_CLIENT_ONLY, Ping(nonce=1), Pong(nonce=1), Hello()], ids=_id)
def test_client_requires_welcome_first(frame: Frame) -> None:
    machine = ProtocolMachine(Role.CLIENT, MAX_FRAME)
    error = _rejected(machine, PREAMBLE + encode_frame(frame))
    assert f"expected Welcome as the first frame, got {type(frame).__name__}" in str(error)


def test_client_accepts_an_error_instead_of_welcome() -> None:
    machine = ProtocolMachine(Role.CLIENT, MAX_FRAME)
    refusal = Error(ErrorCode.UNSUPPORTED_VERSION, "speak version 1")
    assert machine.receive_data(PREAMBLE + encode_frame(refusal)) == [refusal]
    assert machine.state is State.OPEN


def test_handshake_frame_split_from_its_preamble() -> None:
    machine = ProtocolMachine(Role.SERVER, MAX_FRAME)
    hello = encode_frame(Hello(client_name="split"))
    states = []
    for chunk in (PREAMBLE[:3], PREAMBLE[3:] + hello[:5]):
        assert machine.receive_data(chunk) == []
        states.append(machine.state)
    assert machine.receive_data(hello[5:]) == [Hello(client_name="split")]
    states.append(machine.state)
    assert states == [State.PREAMBLE, State.HANDSHAKE, State.OPEN]


# --- direction rules --------------------------------------------------------------


@pytest.mark.parametrize("frame", [*TO_CLIENT_ONLY, Hello(), Welcome()], ids=_id)
def test_server_rejects_frames_meant_for_a_client(frame: Frame) -> None:
    error = _rejected(_open(Role.SERVER), encode_frame(frame))
    assert error.code == ErrorCode.MALFORMED_FRAME
    assert f"{type(frame).__name__} frames are not sent to a server" in str(error)


@pytest.mark.parametrize("frame", [*TO_SERVER_ONLY, Hello(), Welcome()], ids=_id)
def test_client_rejects_frames_meant_for_a_server(frame: Frame) -> None:
    error = _rejected(_open(Role.CLIENT), encode_frame(frame))
    assert f"{type(frame).__name__} frames are not sent to a client" in str(error)


@pytest.mark.parametrize(
    ("role", "frames"),
    [(Role.SERVER, TO_SERVER_ONLY + EITHER_WAY), (Role.CLIENT, TO_CLIENT_ONLY + EITHER_WAY)],
)
def test_open_connection_passes_allowed_frames_in_order(role: Role, frames: list[Frame]) -> None:
    machine = _open(role)
    assert machine.receive_data(b"".join(encode_frame(frame) for frame in frames)) == frames


def test_hello_in_the_same_chunk_as_a_forbidden_frame() -> None:
    # The handshake frame is checked as handshake, the next one by direction rules.
    machine = ProtocolMachine(Role.SERVER, MAX_FRAME)
    data = PREAMBLE + encode_frame(Hello()) + encode_frame(Deliver(stream=1, runs=()))
    assert "Deliver frames are not sent to a server" in str(_rejected(machine, data))


def test_a_bad_frame_loses_the_good_frames_before_it_in_the_same_chunk() -> None:
    machine = _open(Role.SERVER)
    data = encode_frame(Ping(nonce=1)) + encode_frame(Subscribed(stream=1))
    _rejected(machine, data)


# --- frames the machine cannot decode ----------------------------------------------


def test_oversize_frame_uses_the_machines_limit() -> None:
    machine = _open(Role.SERVER)
    error = _rejected(machine, struct.pack("<I", MAX_FRAME + 1))
    assert error.code == ErrorCode.FRAME_TOO_LARGE


def test_undecodable_frame_closes() -> None:
    error = _rejected(_open(Role.CLIENT), struct.pack("<I", 8) + b"\xff" * 8)
    assert error.code == ErrorCode.MALFORMED_FRAME
