"""Unit tests for the frame codec, messages and framing: bytes in, frames out."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import cast

import flatbuffers
import pytest

from broky.protocol.codec import (
    decode_frame,
    encode_frame,
    encode_run_chunk,
    runs_frame_parts,
    table_fields,
)
from broky.protocol.constants import (
    MAX_KEY_BYTES,
    UID_BYTES,
    BodyType,
    ErrorCode,
    NoticeKind,
    SlowConsumerPolicy,
)
from broky.protocol.errors import LocalProtocolError, RemoteProtocolError
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
from broky.protocol.framing import FrameReader
from broky.protocol.message import (
    Message,
    check_sizes,
    decode_message,
    decode_run,
    encode_message,
    message_views,
    pack_sizes,
)

_U32 = struct.Struct("<I")
MAX_U32 = 2**32 - 1
MAX_U64 = 2**64 - 1

ROUND_TRIP_FRAMES: list[Frame] = [
    Hello(),
    Hello(protocol_version=65535, client_name="c" * 300, max_frame_bytes=MAX_U32),
    Welcome(),
    Welcome(
        protocol_version=0,
        server_name="broky/0.1.0",
        max_frame_bytes=0,
        heartbeat_interval_ms=MAX_U32,
        idle_timeout_ms=1,
        max_message_bytes=MAX_U32,
        principal="p" * 300,
    ),
    Hello(user="u", password="p" * 1000, token="t", workers=65535),
    Subscribe(stream=1, pattern=b"a.*.c"),
    Subscribe(stream=2, pattern=b"jobs.>", queue=b"workers"),
    Subscribe(
        stream=MAX_U32, pattern=b"$SYS.>", slow_consumer=SlowConsumerPolicy.DISCONNECT, credit=7
    ),
    Subscribed(stream=MAX_U32),
    Unsubscribe(stream=1),
    Flow(stream=2, credit=MAX_U32),
    Ping(nonce=0),
    Ping(nonce=MAX_U64),
    Pong(nonce=12345),
    *(Error(code=code, message=f"{code.name} happened", stream=5) for code in ErrorCode),
    Error(code=ErrorCode.INTERNAL, message=""),
    Notice(stream=3, kind=NoticeKind.DROPPED, count=MAX_U64),
]


def _frame_id(frame: Frame) -> str:
    return type(frame).__name__


def _run(key: bytes, ts_broker: int, payloads: list[bytes]) -> Run:
    blobs = [encode_message(payload) for payload in payloads]
    return Run(key, ts_broker, len(blobs), pack_sizes([len(b) for b in blobs]), b"".join(blobs))


def _body(frame_bytes: bytes) -> bytes:
    """A frame without its size prefix, checking the prefix on the way."""
    assert _U32.unpack_from(frame_bytes)[0] == len(frame_bytes) - 4
    return frame_bytes[4:]


def _raw_frame(body_type: int, build_body: Callable[[flatbuffers.Builder], int] | None) -> bytes:
    """A frame (without size prefix) whose body the caller builds freely."""
    builder = flatbuffers.Builder(64)
    body = build_body(builder) if build_body else 0
    builder.StartObject(2)
    if body:
        builder.PrependUOffsetTRelativeSlot(1, body, 0)
    builder.PrependUint8Slot(0, body_type, 0)
    builder.FinishSizePrefixed(builder.EndObject())
    return _body(bytes(builder.Output()))


def _raw_publish(
    key: bytes | None = b"k", sizes: list[int] | None = None, messages: bytes | None = b""
) -> bytes:
    """A Publish with one run, any of whose required fields may be left out."""

    def build(builder: flatbuffers.Builder) -> int:
        key_offset = builder.CreateString(key) if key is not None else 0
        messages_offset = builder.CreateByteVector(messages) if messages is not None else 0
        sizes_offset = 0
        if sizes is not None:
            builder.StartVector(4, len(sizes), 4)
            for size in reversed(sizes):
                builder.PrependUint32(size)
            sizes_offset = builder.EndVector()
        builder.StartObject(4)
        for slot, offset in ((0, key_offset), (2, sizes_offset), (3, messages_offset)):
            if offset:
                builder.PrependUOffsetTRelativeSlot(slot, offset, 0)
        run = builder.EndObject()
        builder.StartVector(4, 1, 4)
        builder.PrependUOffsetTRelative(run)
        runs = builder.EndVector()
        builder.StartObject(3)
        builder.PrependUOffsetTRelativeSlot(2, runs, 0)
        return int(builder.EndObject())

    return _raw_frame(BodyType.PUBLISH, build)


def _decode_error(data: bytes | bytearray) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(data)
    return info.value


# --- round trips --------------------------------------------------------------


@pytest.mark.parametrize("frame", ROUND_TRIP_FRAMES, ids=_frame_id)
def test_control_frame_round_trip(frame: Frame) -> None:
    assert decode_frame(_body(encode_frame(frame))) == frame


@pytest.mark.parametrize("frame_type", [Publish, Deliver])
def test_runs_frame_round_trip(frame_type: type[Publish] | type[Deliver]) -> None:
    runs = (
        _run(b"a.b", 1, [b"one", b"", b"three" * 40]),
        _run(b"c", -1, []),
        _run(b"x" * MAX_KEY_BYTES, 2**63 - 1, [b"z"]),
    )
    frame: Frame = (
        Publish(stream=9, runs=runs, stamp_ts_broker=True)
        if frame_type is Publish
        else Deliver(stream=9, runs=runs)
    )
    decoded = decode_frame(_body(encode_frame(frame)))
    assert decoded == frame
    assert isinstance(decoded, frame_type)
    assert [run.count for run in decoded.runs] == [3, 0, 1]


@pytest.mark.parametrize("frame", [Publish(stream=1, runs=()), Deliver(stream=2, runs=())])
def test_runs_frame_without_runs_round_trips(frame: Frame) -> None:
    assert decode_frame(_body(encode_frame(frame))) == frame


def test_decoded_runs_are_views_of_the_frame_buffer() -> None:
    """Long runs are; the compiled reader copies short ones (_forward.pyx)."""
    long_message = b"abc" + b"x" * 600
    data = bytearray(_body(encode_frame(Deliver(stream=1, runs=(_run(b"k", 0, [long_message]),)))))
    decoded = decode_frame(data)
    assert isinstance(decoded, Deliver)
    run = decoded.runs[0]
    assert isinstance(run.messages, memoryview)
    assert isinstance(run.sizes, memoryview)
    position = bytes(data).index(b"abc")
    data[position] = ord("X")
    assert b"Xbc" in bytes(run.messages)


def test_run_chunks_concatenate_into_one_frame() -> None:
    first, second = _run(b"a", 1, [b"1", b"22"]), _run(b"b.c", 2, [b"333"])
    chunks = [encode_run_chunk(r.key, r.ts_broker, r.sizes, r.messages) for r in (first, second)]
    assert all(len(chunk) % 8 == 0 for chunk in chunks)
    parts = runs_frame_parts(BodyType.PUBLISH, 4, chunks, stamp_ts_broker=True)
    decoded = decode_frame(_body(b"".join(parts)))
    assert decoded == Publish(stream=4, runs=(first, second), stamp_ts_broker=True)


def test_error_with_a_newer_peers_code_keeps_its_text() -> None:
    def build(builder: flatbuffers.Builder) -> int:
        message = builder.CreateString("from the future")
        builder.StartObject(3)
        builder.PrependUOffsetTRelativeSlot(1, message, 0)
        builder.PrependUint16Slot(0, 999, 0)
        return int(builder.EndObject())

    decoded = decode_frame(_raw_frame(BodyType.ERROR, build))
    assert decoded == Error(code=ErrorCode.INTERNAL, message="from the future")


def test_encode_frame_rejects_a_non_frame() -> None:
    with pytest.raises(LocalProtocolError, match="cannot encode str"):
        encode_frame(cast(Frame, "not a frame"))


# --- decode errors ------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        *ROUND_TRIP_FRAMES[:4],
        Error(code=ErrorCode.INTERNAL, message="boom", stream=3),
        Publish(stream=1, runs=(_run(b"k.k", 5, [b"hello", b"world"]),)),
    ],
    ids=_frame_id,
)
def test_truncated_frames_raise(frame: Frame) -> None:
    data = _body(encode_frame(frame))
    # Trailing zero bytes may be padding or a string's NUL; any earlier cut loses data.
    significant = len(data.rstrip(b"\x00"))
    decoded_cuts = []
    for cut in range(len(data)):
        try:
            decoded = decode_frame(data[:cut])
        except RemoteProtocolError as exc:
            codes = {exc.code}
        else:
            decoded_cuts.append(cut)
            codes = set()
            assert decoded == frame
        assert codes <= {ErrorCode.MALFORMED_FRAME}
    assert all(cut >= significant for cut in decoded_cuts), decoded_cuts


def test_frame_shorter_than_a_root_raises() -> None:
    assert "shorter than a FlatBuffer root" in str(_decode_error(b"\x08\x00\x00\x00"))


def _ping_with_root() -> tuple[bytearray, int]:
    data = bytearray(_body(encode_frame(Ping(nonce=5))))
    return data, _U32.unpack_from(data)[0]


def test_root_offset_out_of_bounds() -> None:
    data, _ = _ping_with_root()
    for root in (len(data), len(data) - 3, MAX_U32):
        _U32.pack_into(data, 0, root)
        assert "table offset out of bounds" in str(_decode_error(data))


@pytest.mark.parametrize("delta", [+1, -1])
def test_vtable_offset_out_of_bounds(delta: int) -> None:
    data, root = _ping_with_root()
    # soffset = root + 1 puts the vtable before the buffer; -len past its end.
    struct.pack_into("<i", data, root, root + 1 if delta > 0 else -len(data))
    assert "vtable offset out of bounds" in str(_decode_error(data))


@pytest.mark.parametrize(
    ("vtable_size", "table_size"), [(2, 8), (5, 8), (4000, 8), (8, 2), (8, 4000)]
)
def test_bad_vtable_or_table_size(vtable_size: int, table_size: int) -> None:
    data, root = _ping_with_root()
    vtable = root - struct.unpack_from("<i", data, root)[0]
    struct.pack_into("<HH", data, vtable, vtable_size, table_size)
    assert "size" in str(_decode_error(data))


def test_field_offset_outside_its_table() -> None:
    data, root = _ping_with_root()
    vtable = root - struct.unpack_from("<i", data, root)[0]
    table_size = struct.unpack_from("<H", data, vtable + 2)[0]
    struct.pack_into("<H", data, vtable + 4, table_size)
    assert "field offset outside its table" in str(_decode_error(data))


def _hello_name_field() -> tuple[bytearray, int]:
    data = bytearray(_body(encode_frame(Hello(client_name="abcdef"))))
    _, body_field = table_fields(data, _U32.unpack_from(data)[0], 2)
    body = body_field + _U32.unpack_from(data, body_field)[0]
    _, name_field, _ = table_fields(data, body, 3)
    return data, name_field


def test_vector_offset_out_of_bounds() -> None:
    data, name_field = _hello_name_field()
    _U32.pack_into(data, name_field, len(data))
    assert "vector offset out of bounds" in str(_decode_error(data))


def test_vector_longer_than_the_frame() -> None:
    data, name_field = _hello_name_field()
    string_at = name_field + _U32.unpack_from(data, name_field)[0]
    _U32.pack_into(data, string_at, len(data))
    assert "vector runs past the end" in str(_decode_error(data))


def test_invalid_utf8_in_a_string() -> None:
    data, name_field = _hello_name_field()
    string_at = name_field + _U32.unpack_from(data, name_field)[0]
    data[string_at + 4] = 0xFF
    assert "not valid UTF-8" in str(_decode_error(data))


def _empty_table(builder: flatbuffers.Builder) -> int:
    builder.StartObject(0)
    return int(builder.EndObject())


@pytest.mark.parametrize("body_type", [24, 200, 255])
def test_unknown_body_type(body_type: int) -> None:
    error = _decode_error(_raw_frame(body_type, _empty_table))
    assert error.code == ErrorCode.MALFORMED_FRAME
    assert f"unknown frame body type {body_type}" in str(error)


def test_frame_without_body() -> None:
    assert "no body" in str(_decode_error(_raw_frame(BodyType.PING, None)))


def test_subscribe_without_pattern() -> None:
    def build(builder: flatbuffers.Builder) -> int:
        builder.StartObject(4)
        builder.PrependUint32Slot(0, 1, 0)
        return int(builder.EndObject())

    assert "lacks its pattern" in str(_decode_error(_raw_frame(BodyType.SUBSCRIBE, build)))


@pytest.mark.parametrize(
    ("body_type", "slot", "what"),
    [(BodyType.SUBSCRIBE, 2, "slow-consumer policy"), (BodyType.NOTICE, 1, "notice kind")],
)
def test_unknown_enum_values(body_type: BodyType, slot: int, what: str) -> None:
    def build(builder: flatbuffers.Builder) -> int:
        pattern = builder.CreateString("a")
        builder.StartObject(4)
        if body_type == BodyType.SUBSCRIBE:
            builder.PrependUOffsetTRelativeSlot(1, pattern, 0)
        builder.PrependUint8Slot(slot, 77, 0)
        return int(builder.EndObject())

    assert f"unknown {what}" in str(_decode_error(_raw_frame(body_type, build)))


def test_sizes_not_adding_up() -> None:
    run = _run(b"k", 0, [b"a", b"b"])
    bad_sizes = pack_sizes([8, 8])  # the messages are longer than 16 bytes
    chunk = encode_run_chunk(run.key, 0, bad_sizes, run.messages)
    data = b"".join(runs_frame_parts(BodyType.DELIVER, 1, [chunk]))
    assert "do not add up" in str(_decode_error(_body(data)))


def test_generic_layout_sizes_not_adding_up() -> None:
    assert "do not add up" in str(_decode_error(_raw_publish(sizes=[1, 2], messages=b"\x00" * 4)))


@pytest.mark.parametrize(
    ("key", "sizes", "messages"), [(None, [], b""), (b"k", None, b""), (b"k", [], None)]
)
def test_run_missing_a_required_field(
    key: bytes | None, sizes: list[int] | None, messages: bytes | None
) -> None:
    error = _decode_error(_raw_publish(key=key, sizes=sizes, messages=messages))
    assert "lacks a required field" in str(error)
    assert error.code == ErrorCode.MALFORMED_FRAME


def test_generic_layout_run_decodes() -> None:
    message = encode_message(b"payload")
    decoded = decode_frame(_raw_publish(key=b"a.b", sizes=[len(message)], messages=message))
    assert isinstance(decoded, Publish)
    assert decode_run(decoded.runs[0]) == [Message("a.b", b"payload")]


@pytest.mark.parametrize("key_length", [0, MAX_KEY_BYTES + 1, 60_000])
def test_key_length_is_left_to_the_router(key_length: int) -> None:
    # A bad key is a stream error (the router answers InvalidKey and the
    # connection stays up), so the frame decoder must pass it through.
    frame = Publish(stream=1, runs=(_run(b"k" * key_length, 0, [b"x"]),))
    decoded = decode_frame(_body(encode_frame(frame)))
    assert isinstance(decoded, Publish)
    assert decoded.runs[0].key == b"k" * key_length


def test_longest_key_is_accepted() -> None:
    frame = Deliver(stream=1, runs=(_run(b"k" * MAX_KEY_BYTES, 0, [b"x"]),))
    assert decode_frame(_body(encode_frame(frame))) == frame


# --- messages -----------------------------------------------------------------


@pytest.mark.parametrize("payload_size", range(17))
def test_message_sizes_are_multiples_of_8(payload_size: int) -> None:
    for tags in ((), (("t", "v" * payload_size),)):
        data = encode_message(b"p" * payload_size, tags=tags)
        assert len(data) % 8 == 0
        assert decode_message(memoryview(data), "k", 0).payload == b"p" * payload_size


def test_empty_payload() -> None:
    assert decode_message(memoryview(encode_message(b"")), "k", 3) == Message("k", b"", ts_broker=3)


def test_message_with_every_field() -> None:
    uid = bytes(range(UID_BYTES))
    data = encode_message(
        b"body", key_partition=b"part", ts_producer=-7, uid=uid, tags=iter([("a", ""), ("é", "ü")])
    )
    assert decode_message(memoryview(data), "k.k", 9) == Message(
        "k.k", b"body", b"part", -7, 9, uid, (("a", ""), ("é", "ü"))
    )


@pytest.mark.parametrize("uid_length", [1, UID_BYTES - 1, UID_BYTES + 1, 64])
def test_bad_uid_length(uid_length: int) -> None:
    with pytest.raises(LocalProtocolError, match=f"got {uid_length}"):
        encode_message(b"x", uid=b"u" * uid_length)


def test_message_tag_with_invalid_utf8() -> None:
    data = bytearray(encode_message(b"", tags=[("name", "value")]))
    data[bytes(data).index(b"value")] = 0xFF
    with pytest.raises(RemoteProtocolError, match="not valid UTF-8"):
        decode_message(memoryview(data), "k", 0)


@pytest.mark.parametrize("data", [b"", b"\x00\x00", b"\xff" * 8, bytes(8)])
def test_garbage_message_raises(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_message(memoryview(data), "k", 0)


def test_decode_run_rejects_a_bad_message() -> None:
    good = encode_message(b"fine")
    run = Run(b"k", 0, 2, pack_sizes([len(good), 8]), good + b"\xff" * 8)
    assert len(message_views(run)) == 2
    with pytest.raises(RemoteProtocolError):
        decode_run(run)


def test_check_sizes() -> None:
    check_sizes(pack_sizes([8, 16]), bytes(24))
    with pytest.raises(LocalProtocolError, match="do not add up"):
        check_sizes(pack_sizes([8, 16]), bytes(23))
    with pytest.raises(LocalProtocolError, match="do not add up"):
        check_sizes(b"\x08\x00\x00", bytes(8))


# --- framing ------------------------------------------------------------------


def test_reader_reports_bytes_needed() -> None:
    frame = encode_frame(Ping(nonce=1))
    reader = FrameReader(1024)
    assert reader.bytes_needed == 4
    assert reader.feed(frame[:2]) == []
    assert (reader.bytes_needed, reader.buffered_bytes) == (2, 2)
    assert reader.feed(frame[2:6]) == []
    assert reader.bytes_needed == len(frame) - 6
    frames = reader.feed(frame[6:])
    assert [bytes(view) for view in frames] == [frame[4:]]
    assert (reader.bytes_needed, reader.buffered_bytes) == (4, 0)


def test_reader_accepts_a_frame_of_exactly_the_limit() -> None:
    reader = FrameReader(16)
    assert [bytes(v) for v in reader.feed(_U32.pack(16) + bytes(16))] == [bytes(16)]


def test_reader_rejects_an_oversize_frame_before_buffering_it() -> None:
    reader = FrameReader(16)
    with pytest.raises(RemoteProtocolError) as info:
        reader.feed(_U32.pack(17) + bytes(3))
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert "17 bytes exceeds the limit of 16" in str(info.value)


# --- docs/protocol.md -----------------------------------------------------------

PROTOCOL_DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def _doc_hex_dumps() -> list[bytes]:
    """The annotated hex dumps of the worked example, as bytes.

    A dump line is ``OFFSET  hex bytes  comment`` (fields split by two spaces);
    offsets must follow on from each other.
    """
    text = PROTOCOL_DOC.read_text(encoding="utf-8")
    section = text[text.index("## 10. A worked example") :]
    dumps = []
    for block in re.findall(r"```\n(.*?)```", section, flags=re.DOTALL):
        data = bytearray()
        for line in block.splitlines():
            match = re.match(r"([0-9a-f]{4})  ((?:[0-9a-f]{2} ?)*)", line)
            if match is None:
                continue
            assert int(match[1], 16) == len(data), f"offset {match[1]} does not follow on"
            data += bytes.fromhex(match[2])
        dumps.append(bytes(data))
    return dumps


def test_protocol_doc_worked_example_matches_the_encoder() -> None:
    message = encode_message(b"hi")
    run = Run(b"a.b", 0, 1, pack_sizes([len(message)]), message)
    publish = encode_frame(Publish(stream=1, runs=(run,), stamp_ts_broker=True))
    assert _doc_hex_dumps() == [publish, encode_frame(Ping(nonce=7))]
