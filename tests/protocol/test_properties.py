"""Property and fuzz tests for the sans-IO protocol.

The round-trip properties check that what we encode we decode, for arbitrary
values. The fuzz properties check one invariant (as in h11's afl harness and
nats-server's parser fuzz test): any input either parses or raises
RemoteProtocolError, fed whole or in pieces; never any other exception.
"""

from __future__ import annotations

import itertools
import struct
import typing

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.connection import ProtocolMachine, Role, State
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    UID_BYTES,
    ErrorCode,
    NoticeKind,
    SlowConsumerPolicy,
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
    Run,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Welcome,
)
from broky.protocol.framing import FrameReader, encode_preamble
from broky.protocol.message import Message, decode_message, decode_run, encode_message, pack_sizes

#: Every frame type the codec may return: the ``Frame`` union's members, so a
#: frame type added later is covered without editing this list.
FRAME_TYPES: tuple[type[object], ...] = typing.get_args(Frame)
ROUND_TRIP = settings(max_examples=300, deadline=None)
FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ---------------------------------------------------------------

int64s = st.integers(-(2**63), 2**63 - 1)
uint32s = st.integers(0, 2**32 - 1)
texts = st.text(max_size=20)
keys = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=64,
)


@st.composite
def messages(draw: st.DrawFn, key: str = "", ts_broker: int = 0) -> Message:
    return Message(
        key=key,
        payload=draw(st.binary(max_size=200)),
        key_partition=draw(st.binary(max_size=32)),
        ts_producer=draw(int64s),
        ts_broker=ts_broker,
        uid=draw(st.one_of(st.just(b""), st.binary(min_size=UID_BYTES, max_size=UID_BYTES))),
        tags=tuple(draw(st.lists(st.tuples(texts, texts), max_size=4))),
    )


def _encode(message: Message) -> bytes:
    return encode_message(
        message.payload,
        key_partition=message.key_partition,
        ts_producer=message.ts_producer,
        uid=message.uid,
        tags=message.tags,
    )


def _run_of(key: str, ts_broker: int, group: list[Message]) -> Run:
    blobs = [_encode(message) for message in group]
    sizes = pack_sizes([len(blob) for blob in blobs])
    return Run(key.encode(), ts_broker, len(blobs), sizes, b"".join(blobs))


@st.composite
def runs(draw: st.DrawFn) -> tuple[Run, list[Message]]:
    key, ts_broker = draw(keys), draw(int64s)
    group = draw(st.lists(messages(key, ts_broker), max_size=4))
    return _run_of(key, ts_broker, group), group


def _frame_bytes(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted({min(cut, len(data)) for cut in cuts}), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


# --- (a) message round trip ---------------------------------------------------


@ROUND_TRIP
@given(messages(), keys, int64s)
def test_message_round_trip(message: Message, key: str, ts_broker: int) -> None:
    data = _encode(message)
    assert len(data) % 8 == 0
    expected = message._replace(key=key, ts_broker=ts_broker)
    assert decode_message(memoryview(data), key, ts_broker) == expected


# --- (b) Publish / Deliver round trip -----------------------------------------


@ROUND_TRIP
@given(
    st.lists(runs(), max_size=4),
    uint32s,
    st.booleans(),
    st.sampled_from([Publish, Deliver]),
)
def test_runs_frame_round_trip(
    generated_runs: list[tuple[Run, list[Message]]],
    stream: int,
    stamp: bool,
    frame_type: type[Publish] | type[Deliver],
) -> None:
    run_tuple = tuple(run for run, _ in generated_runs)
    frame: Frame = (
        Publish(stream, run_tuple, stamp) if frame_type is Publish else Deliver(stream, run_tuple)
    )
    data = encode_frame(frame)
    assert struct.unpack_from("<I", data)[0] == len(data) - 4

    decoded = decode_frame(data[4:])

    assert decoded == frame
    assert isinstance(decoded, (Publish, Deliver))
    for run, (_, group) in zip(decoded.runs, generated_runs, strict=True):
        assert decode_run(run) == group


# --- (c) framing ----------------------------------------------------------------

MAX_BODY = 64
bodies = st.lists(st.binary(max_size=MAX_BODY), max_size=8)


@settings(max_examples=500, deadline=None)
@given(bodies, st.lists(st.integers(0, 8 * (MAX_BODY + 4)), max_size=12))
def test_reader_yields_the_same_frames_however_the_stream_is_split(
    frame_bodies: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(_frame_bytes(body) for body in frame_bodies)
    reader = FrameReader(MAX_BODY)
    received = [bytes(view) for chunk in _chunks(stream, cuts) for view in reader.feed(chunk)]
    assert received == frame_bodies
    assert (reader.buffered_bytes, reader.bytes_needed) == (0, 4)


@settings(max_examples=500, deadline=None)
@given(
    bodies,
    st.integers(MAX_BODY + 1, 2**32 - 1),
    st.binary(max_size=8),
    st.lists(st.integers(0, 8 * (MAX_BODY + 4) + 12), max_size=12),
)
def test_reader_rejects_oversize_frame_as_soon_as_its_prefix_is_fed(
    frame_bodies: list[bytes], oversize: int, trailing: bytes, cuts: list[int]
) -> None:
    good = b"".join(_frame_bytes(body) for body in frame_bodies)
    stream = good + struct.pack("<I", oversize) + trailing
    prefix_end = len(good) + 4
    reader = FrameReader(MAX_BODY)
    received: list[bytes] = []
    fed = 0
    for chunk in _chunks(stream, cuts):
        if fed + len(chunk) >= prefix_end:
            with pytest.raises(RemoteProtocolError) as info:
                reader.feed(chunk)
            assert info.value.code == ErrorCode.FRAME_TOO_LARGE
            break
        received += [bytes(view) for view in reader.feed(chunk)]
        fed += len(chunk)
    else:
        pytest.fail("the oversize prefix was never fed")
    # Every frame wholly fed before the chunk holding the oversize prefix came out.
    complete = 0
    position = 0
    for body in frame_bodies:
        position += 4 + len(body)
        if position <= fed:
            complete += 1
    assert received == frame_bodies[:complete]
    assert reader.buffered_bytes <= MAX_BODY + 4


# --- (d) fuzz: parses or raises RemoteProtocolError ----------------------------

_RICH = Message(
    "",
    b"payload bytes",
    key_partition=b"kp",
    ts_producer=12,
    uid=bytes(range(UID_BYTES)),
    tags=(("region", "eu"), ("k", "")),
)
_PLAIN = Message("", b"x" * 9, ts_producer=-1)
_RUNS = (_run_of("orders.eu", 77, [_RICH, _PLAIN]), _run_of("a", 0, [_PLAIN]))

CLIENT_TO_SERVER: list[Frame] = [
    Hello(client_name="fuzz", max_frame_bytes=1 << 20),
    Publish(stream=1, runs=_RUNS, stamp_ts_broker=True),
    Subscribe(stream=2, pattern=b"orders.*", slow_consumer=SlowConsumerPolicy.DISCONNECT, credit=5),
    Flow(stream=2, credit=10),
    Unsubscribe(stream=2),
    Ping(nonce=3),
    Pong(nonce=4),
    Error(code=ErrorCode.INVALID_KEY, message="bad", stream=1),
]
SERVER_TO_CLIENT: list[Frame] = [
    Welcome(server_name="broky", heartbeat_interval_ms=1000, idle_timeout_ms=3000),
    Subscribed(stream=2),
    Deliver(stream=2, runs=_RUNS),
    Notice(stream=2, kind=NoticeKind.DROPPED, count=9),
    Ping(nonce=5),
    Error(code=ErrorCode.SLOW_CONSUMER, message="too slow", stream=0),
]
#: Handshake frames with every field set, beyond the conversations' ones.
FULL_HANDSHAKES: list[Frame] = [
    Hello(client_name="fuzz", user="user", password="secret", token="tok"),
    Welcome(server_name="broky", max_message_bytes=1 << 20, principal="user"),
]
#: Frame bodies (no size prefix) to mutate.
CORPUS = [
    encode_frame(frame)[4:] for frame in CLIENT_TO_SERVER + SERVER_TO_CLIENT + FULL_HANDSHAKES
]
DELIVER_CORPUS = [encode_frame(Deliver(stream=2, runs=_RUNS))[4:]]
MESSAGE_CORPUS = [_encode(_RICH), _encode(_PLAIN)]
INTERESTING_U32 = [0, 1, 3, 4, 8, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFC, 0xFFFF_FFFF]


@st.composite
def mutated(draw: st.DrawFn, corpus: list[bytes]) -> bytes:
    """A corpus entry after a few byte flips, word overwrites, truncations,
    insertions and deletions."""
    data = bytearray(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        index = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "word", "truncate", "insert", "delete"]))
        if kind == "flip":
            data[index] ^= draw(st.integers(1, 255))
        elif kind == "word":
            word = draw(st.sampled_from(INTERESTING_U32) | st.integers(0, 2**32 - 1))
            data[index : index + 4] = struct.pack("<I", word)
        elif kind == "truncate":
            del data[index:]
        elif kind == "insert":
            data[index:index] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[index : index + draw(st.integers(1, 8))]
    return bytes(data)


def _decodes_or_rejects(data: bytes | memoryview) -> Frame | None:
    """The invariant: a frame, or RemoteProtocolError (returned as None)."""
    try:
        frame = decode_frame(data)
    except RemoteProtocolError:
        return None
    assert isinstance(frame, FRAME_TYPES)
    return frame


@FUZZ
@given(st.binary(max_size=256))
def test_arbitrary_bytes_decode_or_raise_protocol_error(data: bytes) -> None:
    _decodes_or_rejects(data)


@FUZZ
@given(mutated(CORPUS))
# Found in CI: a mutation that decodes to a ListPartitions frame.
@example(
    b"\x0c\x00\x00\x00\x08\x00\x0e\x00\x07\x00\x08\x00\x08\x00\x00\x00\x00\x00\x00\x0e\x10\x00"
    b"\x00\x00\x00\x00\n\x00\x10\x00\x04\x00\x00\x00\x08\x00\n\x00\x00\x00\x02\x00\x00\x00\t\x00"
    b"\x00\x00\x00\x00\x00\x00"
)
def test_mutated_frames_decode_or_raise_protocol_error(data: bytes) -> None:
    _decodes_or_rejects(data)
    _decodes_or_rejects(memoryview(data))


def _runs_decode_or_reject(frame: Frame | None) -> None:
    if not isinstance(frame, (Publish, Deliver)):
        return
    for run in frame.runs:
        try:
            decoded = decode_run(run)
        except RemoteProtocolError:
            continue
        assert len(decoded) == run.count
        assert all(isinstance(message, Message) for message in decoded)


@FUZZ
@given(mutated(DELIVER_CORPUS))
def test_mutated_deliver_runs_decode_or_raise_protocol_error(data: bytes) -> None:
    _runs_decode_or_reject(_decodes_or_rejects(data))


@FUZZ
@given(mutated(MESSAGE_CORPUS))
def test_mutated_messages_decode_or_raise_protocol_error(data: bytes) -> None:
    try:
        message = decode_message(memoryview(data), "k", 0)
    except RemoteProtocolError:
        return
    assert isinstance(message, Message)


def _stream(frames: list[Frame]) -> list[bytes]:
    return [encode_frame(frame) for frame in frames]


#: Whole conversations (preamble, then framed frames) each role receives.
CONVERSATIONS = {
    Role.SERVER: [encode_preamble() + b"".join(_stream(CLIENT_TO_SERVER))],
    Role.CLIENT: [encode_preamble() + b"".join(_stream(SERVER_TO_CLIENT))],
}


def _feed(machine: ProtocolMachine, chunks: list[bytes]) -> tuple[list[Frame], bool]:
    """Feed chunks until one is rejected; return the frames and whether one was."""
    frames: list[Frame] = []
    for chunk in chunks:
        try:
            frames += machine.receive_data(chunk)
        except RemoteProtocolError:
            assert machine.state is State.CLOSED
            assert machine.receive_data(b"more") == []
            return frames, True
    return frames, False


def _check_fed_three_ways(role: Role, stream: bytes, cuts: list[int]) -> None:
    """Whole, byte by byte or split at ``cuts``: the same frames, or a rejection."""
    byte_by_byte = [stream[index : index + 1] for index in range(len(stream))]
    outcomes = []
    for chunks in ([stream], byte_by_byte, _chunks(stream, cuts)):
        machine = ProtocolMachine(role, DEFAULT_MAX_FRAME_BYTES)
        frames, rejected = _feed(machine, chunks)
        assert all(isinstance(frame, FRAME_TYPES) for frame in frames)
        for frame in frames:
            _runs_decode_or_reject(frame)
        outcomes.append(None if rejected else frames)
    assert outcomes[1:] == outcomes[:1] * 2


@FUZZ
@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
@given(data=st.data())
def test_machine_accepts_or_rejects_mutated_streams_however_fed(
    role: Role, data: st.DataObject
) -> None:
    stream = data.draw(mutated(CONVERSATIONS[role]), label="stream")
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10), label="cuts")
    _check_fed_three_ways(role, stream, cuts)


@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=10))
def test_machine_accepts_or_rejects_arbitrary_bytes_after_the_handshake(
    garbage: bytes, cuts: list[int]
) -> None:
    handshake = encode_preamble() + encode_frame(CLIENT_TO_SERVER[0])
    _check_fed_three_ways(Role.SERVER, handshake + garbage, cuts)


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_unmutated_conversations_are_accepted(role: Role) -> None:
    # Guards the fuzz test above: without mutations, every frame comes through.
    machine = ProtocolMachine(role, DEFAULT_MAX_FRAME_BYTES)
    expected = CLIENT_TO_SERVER if role is Role.SERVER else SERVER_TO_CLIENT
    assert machine.receive_data(CONVERSATIONS[role][0]) == expected
    assert machine.state is State.OPEN
