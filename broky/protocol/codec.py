"""Encode and decode frames: FlatBuffers-compatible, written for speed.

Why hand-written: FlatBuffers' generated Python costs 5-18 us per table read
or built, the whole per-message budget several times over. This module reads
tables through their vtables with ``struct`` (so it accepts any valid layout
another language's builder produces) and builds the two hot frames, Publish
and Deliver, from pre-encoded *run chunks* with a couple of ``struct.pack``
calls. Rare control frames go through the official ``flatbuffers.Builder``.

Run chunks. A chunk is one ``Run`` table laid out contiguously with its
vtable and vectors, starting 8-byte aligned, with a length that is a multiple
of 8. FlatBuffers offsets are relative, so a chunk can be copied verbatim into
any frame at an 8-aligned position: the broker encodes a run's chunk once on
receipt and every subscriber's Deliver frame just concatenates chunks behind
a small header. That is what keeps fan-out cost per run, not per message.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Sequence
from typing import Final

import flatbuffers

from broky.protocol.constants import (
    BodyType,
    ErrorCode,
    LinkKind,
    NoticeKind,
    SlowConsumerPolicy,
    StartKind,
)
from broky.protocol.errors import LocalProtocolError, RemoteProtocolError
from broky.protocol.frames import (
    Buffer,
    Deliver,
    Error,
    Fetch,
    Fetched,
    Flow,
    Frame,
    Hello,
    ListPartitions,
    Notice,
    Partitions,
    Ping,
    Pong,
    Publish,
    PublishAck,
    Run,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Welcome,
)

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_VT_HEAD = struct.Struct("<HH")

#: Zero padding by length, so padding never allocates.
PADDING: Final = tuple(bytes(n) for n in range(9))

# --- run chunk layout (offsets from the chunk start) -------------------------
#  0  vtable: size 12, table size 28, key@12 ts@4 sizes@16 messages@20
# 12  table: soffset 12 (vtable at chunk start)
# 16  int64 ts_broker            (8-aligned, so it can be stamped in place)
# 24  uoffset key, 28 uoffset sizes, 32 uoffset messages, 36 padding
# 40  sizes vector, then the messages vector (data 8-aligned), then the key.
_CHUNK_HEAD: Final = struct.Struct("<6HiqIIII")
#: Where the Run table starts inside a chunk.
CHUNK_TABLE_OFFSET: Final = 12
#: Where ts_broker sits inside a chunk.
CHUNK_TS_OFFSET: Final = 16
_CHUNK_SIZES_AT: Final = 40

# --- Publish / Deliver header layout (offsets from the size prefix) ---------
#  0  size prefix            4  root uoffset -> 16
#  8  Frame vtable (8 bytes): body_type@8 body@4
# 16  Frame table: soffset 8, 20 body uoffset -> 40, 24 body_type, pad
# 28  body vtable (Publish 10 bytes / Deliver 8 bytes, padded to 12)
# 40  body table: soffset 12, 44 stream, 48 runs uoffset -> 56, 52 stamp flag,
#     53 ack flag (Publish with ack only)
# 56  runs vector: count, then one uoffset per run; padded to 8; chunks follow.
_RUNS_HEAD: Final = struct.Struct("<II4HiIB3x6HiIIBB2xI")
_RUNS_VECTOR_AT: Final = 56


def _native_u32(view: memoryview) -> Sequence[int]:
    return view.cast("B").cast("I") if view else ()


def _portable_u32(view: memoryview) -> Sequence[int]:
    return struct.unpack(f"<{len(view) // 4}I", view)


#: A little-endian uint32 array as integers; zero-copy on little-endian hosts.
u32_array: Callable[[memoryview], Sequence[int]] = (
    _native_u32 if sys.byteorder == "little" else _portable_u32
)


def sum_u32(view: memoryview) -> int:
    """Sum of a little-endian uint32 array, at C speed."""
    return sum(u32_array(view))


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _chunk_tail(
    sizes_at: int, key: bytes, sizes: Buffer, messages: Buffer
) -> tuple[int, int, list[Buffer]]:
    """Lay out a chunk's vectors from ``sizes_at``: return where the messages
    vector and the key string start, and the parts after the chunk's head."""
    sizes_len = len(sizes)
    messages_len = len(messages)
    key_len = len(key)
    sizes_end = sizes_at + 4 + sizes_len
    messages_at = sizes_end + ((4 - sizes_end) & 7)  # data at messages_at + 4, 8-aligned
    messages_end = messages_at + 4 + messages_len
    key_at = (messages_end + 3) & ~3
    key_end = key_at + 4 + key_len + 1  # strings carry a NUL terminator
    chunk_end = _align8(key_end)
    return (
        messages_at,
        key_at,
        [
            _U32.pack(sizes_len >> 2),
            sizes,
            PADDING[messages_at - sizes_end],
            _U32.pack(messages_len),
            messages,
            PADDING[key_at - messages_end],
            _U32.pack(key_len),
            key,
            PADDING[chunk_end - key_end + 1],
        ],
    )


def encode_run_chunk(key: bytes, ts_broker: int, sizes: Buffer, messages: Buffer) -> bytes:
    """Encode a relocatable Run chunk (see module docstring).

    ``sizes`` is the raw little-endian uint32 size table and ``messages`` the
    concatenated message buffers. The caller guarantees they agree.
    """
    messages_at, key_at, tail = _chunk_tail(_CHUNK_SIZES_AT, key, sizes, messages)
    head = _CHUNK_HEAD.pack(
        12, 28, 12, 4, 16, 20, 12, ts_broker, key_at - 24, _CHUNK_SIZES_AT - 28, messages_at - 32, 0
    )
    return b"".join((head, *tail))


# --- durable run chunk layout: the table's vtable sits after it --------------
#  0  12 bytes of zeros (so that the table starts at CHUNK_TABLE_OFFSET too)
# 12  table: soffset -36 (vtable at 48), 16 int64 ts_broker, 24 int64
#     base_offset, 32 uoffset key, 36 uoffset sizes, 40 uoffset messages,
#     44 uint32 partition
# 48  vtable: size 16, table size 36, key@20 ts@4 sizes@24 messages@28
#     partition@32 base_offset@12
# 64  sizes vector, messages vector, key, as in the ephemeral chunk.
_DURABLE_CHUNK_HEAD: Final = struct.Struct("<12xiqqIIII8H")
_DURABLE_SIZES_AT: Final = 64


def encode_durable_run_chunk(run: Run) -> bytes:
    """Encode a relocatable chunk of a run that carries ``partition`` and
    ``base_offset`` (a run of a durable topic). Same rules as
    :func:`encode_run_chunk`; only runs with offsets pay for the two fields."""
    messages_at, key_at, tail = _chunk_tail(_DURABLE_SIZES_AT, run.key, run.sizes, run.messages)
    head = _DURABLE_CHUNK_HEAD.pack(
        -36,
        run.ts_broker,
        run.base_offset,
        key_at - 32,
        _DURABLE_SIZES_AT - 36,
        messages_at - 40,
        run.partition,
        16,
        36,
        20,
        4,
        24,
        28,
        32,
        12,
    )
    return b"".join((head, *tail))


def encode_chunk(run: Run) -> bytes:
    """The chunk of any run: with its offsets when it has them."""
    if run.base_offset >= 0:
        return encode_durable_run_chunk(run)
    return encode_run_chunk(run.key, run.ts_broker, run.sizes, run.messages)


def runs_frame_parts(
    body_type: BodyType,
    stream: int,
    chunks: Sequence[bytes],
    stamp_ts_broker: bool = False,
    ack: bool = False,
) -> list[bytes]:
    """Return the parts of a size-prefixed Publish, Deliver or Fetched frame.

    The caller joins the parts (usually together with other frames, for one
    write). ``chunks`` must come from :func:`encode_run_chunk`.
    """
    count = len(chunks)
    vector_end = _RUNS_VECTOR_AT + 4 + 4 * count
    pad = (-vector_end) & 7
    position = vector_end + pad + CHUNK_TABLE_OFFSET - _RUNS_VECTOR_AT - 4
    offsets = []
    for chunk in chunks:
        offsets.append(position)
        position += len(chunk) - 4
    total = vector_end + pad + sum(len(chunk) for chunk in chunks)
    if body_type == BodyType.PUBLISH:
        vtable = (12, 16, 4, 12, 8, 13) if ack else (10, 16, 4, 12, 8, 0)
    else:
        vtable = (8, 12, 4, 8, 0, 0)
    head = _RUNS_HEAD.pack(
        total - 4,
        12,
        8,
        12,
        8,
        4,
        8,
        20,
        body_type,
        *vtable,
        12,
        stream,
        8,
        1 if stamp_ts_broker else 0,
        1 if ack else 0,
        count,
    )
    parts = [head, struct.pack(f"<{count}I", *offsets), PADDING[pad]]
    parts.extend(chunks)
    return parts


# --- control frames through flatbuffers.Builder ------------------------------


def _finish(builder: flatbuffers.Builder, body_type: BodyType, body: int) -> bytes:
    builder.StartObject(2)
    builder.PrependUOffsetTRelativeSlot(1, body, 0)
    builder.PrependUint8Slot(0, body_type, 0)
    builder.FinishSizePrefixed(builder.EndObject())
    return bytes(builder.Output())


def _encode_control(frame: Frame) -> bytes:  # noqa: PLR0911
    builder = flatbuffers.Builder(128)
    if isinstance(frame, Hello):
        name = builder.CreateString(frame.client_name)
        node = builder.CreateString(frame.node) if frame.node else 0
        user = builder.CreateString(frame.user) if frame.user else 0
        password = builder.CreateString(frame.password) if frame.password else 0
        token = builder.CreateString(frame.token) if frame.token else 0
        builder.StartObject(9)
        for slot, text in ((7, token), (6, password), (5, user), (4, node)):
            if text:
                builder.PrependUOffsetTRelativeSlot(slot, text, 0)
        builder.PrependUint16Slot(8, frame.workers, 0)
        builder.PrependUint32Slot(2, frame.max_frame_bytes, 0)
        builder.PrependUOffsetTRelativeSlot(1, name, 0)
        builder.PrependUint16Slot(0, frame.protocol_version, 1)
        builder.PrependUint8Slot(3, frame.link, 0)
        return _finish(builder, BodyType.HELLO, builder.EndObject())
    if isinstance(frame, Welcome):
        name = builder.CreateString(frame.server_name)
        principal = builder.CreateString(frame.principal) if frame.principal else 0
        builder.StartObject(7)
        if principal:
            builder.PrependUOffsetTRelativeSlot(6, principal, 0)
        builder.PrependUint32Slot(5, frame.max_message_bytes, 0)
        builder.PrependUint32Slot(4, frame.idle_timeout_ms, 0)
        builder.PrependUint32Slot(3, frame.heartbeat_interval_ms, 0)
        builder.PrependUint32Slot(2, frame.max_frame_bytes, 0)
        builder.PrependUOffsetTRelativeSlot(1, name, 0)
        builder.PrependUint16Slot(0, frame.protocol_version, 1)
        return _finish(builder, BodyType.WELCOME, builder.EndObject())
    if isinstance(frame, Subscribe):
        pattern = builder.CreateString(frame.pattern)
        offsets = _vector(builder, frame.start_offsets, 8, True) if frame.start_offsets else 0
        builder.StartObject(7)
        builder.PrependInt64Slot(5, frame.start_time, 0)
        if offsets:
            builder.PrependUOffsetTRelativeSlot(6, offsets, 0)
        builder.PrependUint32Slot(3, frame.credit, 0)
        builder.PrependUOffsetTRelativeSlot(1, pattern, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUint8Slot(2, frame.slow_consumer, 0)
        builder.PrependUint8Slot(4, frame.start, 0)
        return _finish(builder, BodyType.SUBSCRIBE, builder.EndObject())
    if isinstance(frame, (Subscribed, Unsubscribe)):
        builder.StartObject(1)
        builder.PrependUint32Slot(0, frame.stream, 0)
        body_type = BodyType.SUBSCRIBED if isinstance(frame, Subscribed) else BodyType.UNSUBSCRIBE
        return _finish(builder, body_type, builder.EndObject())
    if isinstance(frame, Flow):
        builder.StartObject(2)
        builder.PrependUint32Slot(1, frame.credit, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        return _finish(builder, BodyType.FLOW, builder.EndObject())
    if isinstance(frame, (Ping, Pong)):
        builder.StartObject(1)
        builder.PrependUint64Slot(0, frame.nonce, 0)
        body_type = BodyType.PING if isinstance(frame, Ping) else BodyType.PONG
        return _finish(builder, body_type, builder.EndObject())
    if isinstance(frame, Error):
        message = builder.CreateString(frame.message)
        builder.StartObject(3)
        builder.PrependUOffsetTRelativeSlot(1, message, 0)
        builder.PrependUint32Slot(2, frame.stream, 0)
        builder.PrependUint16Slot(0, frame.code, 0)
        return _finish(builder, BodyType.ERROR, builder.EndObject())
    if isinstance(frame, Notice):
        builder.StartObject(3)
        builder.PrependUint64Slot(2, frame.count, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUint8Slot(1, frame.kind, 0)
        return _finish(builder, BodyType.NOTICE, builder.EndObject())
    return _encode_storage_control(builder, frame)


def _vector(builder: flatbuffers.Builder, values: Sequence[int], size: int, signed: bool) -> int:
    builder.StartVector(size, len(values), size)
    prepend = builder.PrependInt64 if signed else builder.PrependUint32
    for value in reversed(values):
        prepend(value)
    return int(builder.EndVector())


def _encode_storage_control(builder: flatbuffers.Builder, frame: Frame) -> bytes:
    """The control frames of the durable-topic read and ack API."""
    if isinstance(frame, PublishAck):
        last = _vector(builder, frame.last_offsets, 8, True)
        first = _vector(builder, frame.first_offsets, 8, True)
        partitions = _vector(builder, frame.partitions, 4, False)
        runs = _vector(builder, frame.runs, 4, False)
        builder.StartObject(6)
        builder.PrependUint64Slot(1, frame.sequence, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUOffsetTRelativeSlot(2, runs, 0)
        builder.PrependUOffsetTRelativeSlot(3, partitions, 0)
        builder.PrependUOffsetTRelativeSlot(4, first, 0)
        builder.PrependUOffsetTRelativeSlot(5, last, 0)
        return _finish(builder, BodyType.PUBLISH_ACK, builder.EndObject())
    if isinstance(frame, ListPartitions):
        topic = builder.CreateString(frame.topic)
        builder.StartObject(2)
        builder.PrependUOffsetTRelativeSlot(1, topic, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        return _finish(builder, BodyType.LIST_PARTITIONS, builder.EndObject())
    if isinstance(frame, Partitions):
        names = [builder.CreateString(name) for name in frame.topics]
        builder.StartVector(4, len(names), 4)
        for name in reversed(names):
            builder.PrependUOffsetTRelative(name)
        topics = builder.EndVector()
        ends = _vector(builder, frame.end_offsets, 8, True)
        starts = _vector(builder, frame.start_offsets, 8, True)
        partitions = _vector(builder, frame.partitions, 4, False)
        builder.StartObject(5)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUOffsetTRelativeSlot(1, topics, 0)
        builder.PrependUOffsetTRelativeSlot(2, partitions, 0)
        builder.PrependUOffsetTRelativeSlot(3, starts, 0)
        builder.PrependUOffsetTRelativeSlot(4, ends, 0)
        return _finish(builder, BodyType.PARTITIONS, builder.EndObject())
    if isinstance(frame, Fetch):
        topic = builder.CreateString(frame.topic)
        builder.StartObject(5)
        builder.PrependInt64Slot(3, frame.offset, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUOffsetTRelativeSlot(1, topic, 0)
        builder.PrependUint32Slot(2, frame.partition, 0)
        builder.PrependUint32Slot(4, frame.max_bytes, 0)
        return _finish(builder, BodyType.FETCH, builder.EndObject())
    raise LocalProtocolError(f"cannot encode {type(frame).__name__} as a control frame")


def encode_frame(frame: Frame) -> bytes:
    """Encode any frame as size-prefixed bytes, ready to write."""
    if isinstance(frame, (Publish, Deliver, Fetched)):
        chunks = [encode_chunk(run) for run in frame.runs]
        if isinstance(frame, Publish):
            parts = runs_frame_parts(
                BodyType.PUBLISH, frame.stream, chunks, frame.stamp_ts_broker, frame.ack
            )
        elif isinstance(frame, Fetched):
            parts = runs_frame_parts(BodyType.FETCHED, frame.stream, chunks)
        else:
            parts = runs_frame_parts(BodyType.DELIVER, frame.stream, chunks)
        return b"".join(parts)
    return _encode_control(frame)


# --- decoding ----------------------------------------------------------------


def _malformed(what: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed frame: {what}", ErrorCode.MALFORMED_FRAME)


def table_fields(buf: Buffer, table: int, count: int) -> list[int]:
    """Absolute positions of a table's first ``count`` fields (0 = absent).

    Raises RemoteProtocolError when the table or its vtable lies outside
    ``buf``; positions of present fields are inside the table.
    """
    size = len(buf)
    if table < 0 or table + 4 > size:
        raise _malformed("table offset out of bounds")
    vtable = table - _I32.unpack_from(buf, table)[0]
    if vtable < 0 or vtable + 4 > size:
        raise _malformed("vtable offset out of bounds")
    vtable_size, table_size = _VT_HEAD.unpack_from(buf, vtable)
    if vtable_size < 4 or vtable_size & 1 or vtable + vtable_size > size:
        raise _malformed("bad vtable size")
    if table_size < 4 or table + table_size > size:
        raise _malformed("bad table size")
    present = min(count, (vtable_size - 4) >> 1)
    offsets = struct.unpack_from(f"<{present}H", buf, vtable + 4)
    fields = [0] * count
    for index, offset in enumerate(offsets):
        if offset:
            if offset < 4 or offset >= table_size:
                raise _malformed("field offset outside its table")
            fields[index] = table + offset
    return fields


def vector(buf: Buffer, field: int, element_size: int) -> tuple[int, int]:
    """Return ``(start, length)`` of the vector a uoffset field points to."""
    target = field + _U32.unpack_from(buf, field)[0]
    if target + 4 > len(buf):
        raise _malformed("vector offset out of bounds")
    length = _U32.unpack_from(buf, target)[0]
    start = target + 4
    if start + length * element_size > len(buf):
        raise _malformed("vector runs past the end of the frame")
    return start, length


def read_bytes(buf: Buffer, field: int) -> bytes:
    """A ``[ubyte]`` or ``string`` field as bytes (b"" when absent)."""
    if not field:
        return b""
    start, length = vector(buf, field, 1)
    return bytes(buf[start : start + length])


def read_text(buf: Buffer, field: int) -> str:
    """A ``string`` field decoded as UTF-8 (\"\" when absent)."""
    try:
        return read_bytes(buf, field).decode()
    except UnicodeDecodeError as exc:
        raise _malformed("string is not valid UTF-8") from exc


def _scalar(unpacker: struct.Struct, buf: Buffer, field: int, default: int = 0) -> int:
    return unpacker.unpack_from(buf, field)[0] if field else default


def _decode_run(buf: Buffer, table: int) -> Run:
    key_field, ts_field, sizes_field, messages_field, partition_field, offset_field = table_fields(
        buf, table, 6
    )
    if not (key_field and sizes_field and messages_field):
        raise _malformed("run lacks a required field (key, sizes, messages)")
    key_start, key_len = vector(buf, key_field, 1)
    sizes_start, count = vector(buf, sizes_field, 4)
    messages_start, messages_len = vector(buf, messages_field, 1)
    view = memoryview(buf)
    sizes = view[sizes_start : sizes_start + 4 * count]
    if sum_u32(sizes) != messages_len:
        raise _malformed("run sizes do not add up to the length of its messages")
    return Run(
        key=bytes(view[key_start : key_start + key_len]),
        ts_broker=_scalar(_I64, buf, ts_field),
        count=count,
        sizes=sizes,
        messages=view[messages_start : messages_start + messages_len],
        partition=_scalar(_U32, buf, partition_field),
        base_offset=_scalar(_I64, buf, offset_field, -1),
    )


def _decode_runs(buf: Buffer, field: int) -> tuple[Run, ...]:
    if not field:
        return ()
    start, count = vector(buf, field, 4)
    return tuple(
        _decode_run(buf, slot + _U32.unpack_from(buf, slot)[0])
        for slot in range(start, start + 4 * count, 4)
    )


def _decode_body(buf: Buffer, body_type: int, table: int) -> Frame:  # noqa: PLR0911
    if body_type == BodyType.PUBLISH:
        stream, stamp, runs, ack = table_fields(buf, table, 4)
        return Publish(
            stream=_scalar(_U32, buf, stream),
            runs=_decode_runs(buf, runs),
            stamp_ts_broker=bool(_scalar(_U8, buf, stamp)),
            ack=bool(_scalar(_U8, buf, ack)),
        )
    if body_type in (BodyType.DELIVER, BodyType.FETCHED):
        stream, runs = table_fields(buf, table, 2)
        cls_runs = Deliver if body_type == BodyType.DELIVER else Fetched
        return cls_runs(stream=_scalar(_U32, buf, stream), runs=_decode_runs(buf, runs))
    if body_type == BodyType.SUBSCRIBE:
        stream, pattern, policy, credit, start, start_time, offsets = table_fields(buf, table, 7)
        if not pattern:
            raise _malformed("subscribe lacks its pattern")
        try:
            slow_consumer = SlowConsumerPolicy(_scalar(_U8, buf, policy))
            start_kind = StartKind(_scalar(_U8, buf, start))
        except ValueError as exc:
            raise _malformed("unknown slow-consumer policy or start position") from exc
        return Subscribe(
            stream=_scalar(_U32, buf, stream),
            pattern=read_bytes(buf, pattern),
            slow_consumer=slow_consumer,
            credit=_scalar(_U32, buf, credit),
            start=start_kind,
            start_time=_scalar(_I64, buf, start_time),
            start_offsets=_numbers(buf, offsets, "q"),
        )
    if body_type in _STORAGE_BODIES:
        return _decode_storage_body(buf, body_type, table)
    if body_type in (BodyType.SUBSCRIBED, BodyType.UNSUBSCRIBE):
        (stream,) = table_fields(buf, table, 1)
        cls = Subscribed if body_type == BodyType.SUBSCRIBED else Unsubscribe
        return cls(stream=_scalar(_U32, buf, stream))
    if body_type == BodyType.FLOW:
        stream, credit = table_fields(buf, table, 2)
        return Flow(stream=_scalar(_U32, buf, stream), credit=_scalar(_U32, buf, credit))
    if body_type in (BodyType.PING, BodyType.PONG):
        (nonce,) = table_fields(buf, table, 1)
        cls_ping = Ping if body_type == BodyType.PING else Pong
        return cls_ping(nonce=_scalar(_U64, buf, nonce))
    if body_type == BodyType.HELLO:
        version, name, max_frame, link, node, user, password, token, workers = table_fields(
            buf, table, 9
        )
        try:
            link_kind = LinkKind(_scalar(_U8, buf, link))
        except ValueError as exc:
            raise _malformed("unknown link kind") from exc
        return Hello(
            protocol_version=_scalar(_U16, buf, version, 1),
            client_name=read_text(buf, name),
            max_frame_bytes=_scalar(_U32, buf, max_frame),
            link=link_kind,
            node=read_text(buf, node),
            user=read_text(buf, user),
            password=read_text(buf, password),
            token=read_text(buf, token),
            workers=_scalar(_U16, buf, workers),
        )
    if body_type == BodyType.WELCOME:
        version, name, max_frame, heartbeat, idle, max_message, principal = table_fields(
            buf, table, 7
        )
        return Welcome(
            protocol_version=_scalar(_U16, buf, version, 1),
            server_name=read_text(buf, name),
            max_frame_bytes=_scalar(_U32, buf, max_frame),
            heartbeat_interval_ms=_scalar(_U32, buf, heartbeat),
            idle_timeout_ms=_scalar(_U32, buf, idle),
            max_message_bytes=_scalar(_U32, buf, max_message),
            principal=read_text(buf, principal),
        )
    if body_type == BodyType.ERROR:
        code, message, stream = table_fields(buf, table, 3)
        raw_code = _scalar(_U16, buf, code)
        try:
            error_code = ErrorCode(raw_code)
        except ValueError:
            error_code = ErrorCode.INTERNAL  # a newer peer's code: keep the text
        return Error(
            code=error_code, message=read_text(buf, message), stream=_scalar(_U32, buf, stream)
        )
    if body_type == BodyType.NOTICE:
        stream, kind, count = table_fields(buf, table, 3)
        try:
            notice_kind = NoticeKind(_scalar(_U8, buf, kind))
        except ValueError as exc:
            raise _malformed("unknown notice kind") from exc
        return Notice(
            stream=_scalar(_U32, buf, stream), kind=notice_kind, count=_scalar(_U64, buf, count)
        )
    raise _malformed(f"unknown frame body type {body_type}")


_STORAGE_BODIES: Final = frozenset(
    (BodyType.PUBLISH_ACK, BodyType.LIST_PARTITIONS, BodyType.PARTITIONS, BodyType.FETCH)
)


def _numbers(buf: Buffer, field: int, code: str) -> tuple[int, ...]:
    """A ``[uint32]`` (code "I") or ``[int64]`` (code "q") field as a tuple."""
    if not field:
        return ()
    size = struct.calcsize(code)
    start, length = vector(buf, field, size)
    return struct.unpack_from(f"<{length}{code}", buf, start)


def _check_parallel(what: str, *vectors: Sequence[object]) -> None:
    """Parallel vectors (entry i of each describes one thing) must agree in length."""
    if len({len(items) for items in vectors}) > 1:
        raise _malformed(f"{what} vectors differ in length")


def _decode_storage_body(buf: Buffer, body_type: int, table: int) -> Frame:
    if body_type == BodyType.PUBLISH_ACK:
        stream, sequence, runs, partitions, first, last = table_fields(buf, table, 6)
        ack = PublishAck(
            stream=_scalar(_U32, buf, stream),
            sequence=_scalar(_U64, buf, sequence),
            runs=_numbers(buf, runs, "I"),
            partitions=_numbers(buf, partitions, "I"),
            first_offsets=_numbers(buf, first, "q"),
            last_offsets=_numbers(buf, last, "q"),
        )
        _check_parallel(
            "publish ack", ack.runs, ack.partitions, ack.first_offsets, ack.last_offsets
        )
        return ack
    if body_type == BodyType.LIST_PARTITIONS:
        stream, topic = table_fields(buf, table, 2)
        return ListPartitions(stream=_scalar(_U32, buf, stream), topic=read_text(buf, topic))
    if body_type == BodyType.PARTITIONS:
        stream, topics_field, partitions, starts, ends = table_fields(buf, table, 5)
        names: list[str] = []
        if topics_field:
            start, count = vector(buf, topics_field, 4)
            for slot in range(start, start + 4 * count, 4):
                position = slot + _U32.unpack_from(buf, slot)[0]
                names.append(_string_at(buf, position))
        answer = Partitions(
            stream=_scalar(_U32, buf, stream),
            topics=tuple(names),
            partitions=_numbers(buf, partitions, "I"),
            start_offsets=_numbers(buf, starts, "q"),
            end_offsets=_numbers(buf, ends, "q"),
        )
        _check_parallel(
            "partitions",
            answer.topics,
            answer.partitions,
            answer.start_offsets,
            answer.end_offsets,
        )
        return answer
    stream, topic, partition, offset, max_bytes = table_fields(buf, table, 5)
    return Fetch(
        stream=_scalar(_U32, buf, stream),
        topic=read_text(buf, topic),
        partition=_scalar(_U32, buf, partition),
        offset=_scalar(_I64, buf, offset),
        max_bytes=_scalar(_U32, buf, max_bytes),
    )


def _string_at(buf: Buffer, position: int) -> str:
    """The string whose length prefix is at ``position`` (a vector element)."""
    if position + 4 > len(buf):
        raise _malformed("string offset out of bounds")
    length = _U32.unpack_from(buf, position)[0]
    if position + 4 + length > len(buf):
        raise _malformed("string runs past the end of the frame")
    try:
        return bytes(buf[position + 4 : position + 4 + length]).decode()
    except UnicodeDecodeError as exc:
        raise _malformed("string is not valid UTF-8") from exc


def decode_frame(buf: Buffer) -> Frame:
    """Decode one frame: the FlatBuffer after its size prefix.

    Any input either decodes or raises RemoteProtocolError; Publish and
    Deliver runs hold zero-copy views of ``buf``.
    """
    try:
        if len(buf) < 8:
            raise _malformed("frame shorter than a FlatBuffer root")
        root = _U32.unpack_from(buf, 0)[0]
        body_type_field, body_field = table_fields(buf, root, 2)
        if not (body_type_field and body_field):
            raise _malformed("frame has no body")
        body_type = _U8.unpack_from(buf, body_type_field)[0]
        body = body_field + _U32.unpack_from(buf, body_field)[0]
        return _decode_body(buf, body_type, body)
    except struct.error as exc:
        raise _malformed(str(exc)) from exc


#: Upper bound of what a run chunk adds to its messages, its key and 4 bytes
#: per message: the table (40 bytes; 64 in a durable chunk, whose table also
#: holds partition and base_offset), three vector lengths, the NUL and padding.
RUN_CHUNK_OVERHEAD: Final = 96


def run_chunk_message_sizes(chunk: bytes) -> Sequence[int]:
    """The message sizes of a run chunk made by :func:`encode_run_chunk`."""
    return u32_array(memoryview(_decode_run(chunk, CHUNK_TABLE_OFFSET).sizes))


def split_run_chunk(chunk: bytes, first_count: int) -> tuple[bytes, bytes]:
    """Split a run chunk after its first ``first_count`` messages.

    Used when a subscription's flow-control credit ends inside a run; costs
    two re-encodes, so it happens at most once per credit window.
    """
    run = _decode_run(chunk, CHUNK_TABLE_OFFSET)
    if not 0 < first_count < run.count:
        raise LocalProtocolError(f"cannot split a run of {run.count} after {first_count}")
    sizes = memoryview(run.sizes)
    cut = sum_u32(sizes[: 4 * first_count])
    messages = memoryview(run.messages)
    head = Run(
        run.key,
        run.ts_broker,
        first_count,
        sizes[: 4 * first_count],
        messages[:cut],
        run.partition,
        run.base_offset,
    )
    tail_offset = run.base_offset + first_count if run.base_offset >= 0 else -1
    tail = Run(
        run.key,
        run.ts_broker,
        run.count - first_count,
        sizes[4 * first_count :],
        messages[cut:],
        run.partition,
        tail_offset,
    )
    return encode_chunk(head), encode_chunk(tail)
