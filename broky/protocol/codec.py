"""Encode and decode frames: FlatBuffers-compatible, written for speed.

Why hand-written: FlatBuffers' generated Python costs 5-18 us per table read
or built, the whole per-message budget several times over. This module reads
tables through their vtables with ``struct`` (so it accepts any valid layout
another language's builder produces) and builds the two hot frames, Publish
and Deliver, from pre-encoded *run chunks* with a couple of ``struct.pack``
calls. Rare control frames go through the official ``flatbuffers.Builder``.

Run chunks, the relocatable run layout those frames are made of, and the fast
readers that recognise it on receipt live in ``broky.protocol.chunks``; this
module re-exports what the rest of Broky uses.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Final

import flatbuffers

from broky.protocol.chunk_reading import RUNS_FRAME_RUNS_AT, read_runs_frame
from broky.protocol.chunks import (
    CHUNK_TABLE_OFFSET,
    CHUNK_TS_OFFSET,
    PADDING,
    encode_chunk,
    encode_durable_run_chunk,
    encode_run_chunk,
    runs_frame_parts,
    sum_u32,
    u32_array,
)
from broky.protocol.constants import (
    BodyType,
    ErrorCode,
    LinkKind,
    NoticeKind,
    SlowConsumerPolicy,
    StartKind,
)
from broky.protocol.consumer_codec import (
    CONSUMER_BODIES,
    decode_consumer_body,
    encode_consumer_frame,
)
from broky.protocol.errors import LocalProtocolError
from broky.protocol.frames import (
    Buffer,
    Deliver,
    Error,
    Fetched,
    Flow,
    Frame,
    Hello,
    LocatedDeliver,
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
from broky.protocol.located import read_chunk_runs_pure
from broky.protocol.producer_frames import producer_frame_parts
from broky.protocol.steady_frames import write_steady_frame
from broky.protocol.storage_codec import STORAGE_BODIES, decode_storage_body, encode_storage_frame
from broky.protocol.tables import (
    finish_frame,
    malformed,
    numbers,
    packed_vector,
    read_bytes,
    read_text,
    scalar,
    table_fields,
    vector,
)

__all__ = [
    "CHUNK_TABLE_OFFSET",
    "CHUNK_TS_OFFSET",
    "PADDING",
    "RUN_CHUNK_OVERHEAD",
    "decode_frame",
    "encode_chunk",
    "encode_durable_run_chunk",
    "encode_frame",
    "encode_run_chunk",
    "read_bytes",
    "read_text",
    "run_chunk_message_sizes",
    "runs_frame_parts",
    "split_run_chunk",
    "sum_u32",
    "table_fields",
    "u32_array",
    "vector",
]

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_VT_HEAD = struct.Struct("<HH")


# --- control frames through flatbuffers.Builder ------------------------------


def _encode_control(frame: Frame) -> bytes:  # noqa: PLR0911
    written = write_steady_frame(frame)
    if written is not None:
        return written
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
        return finish_frame(builder, BodyType.HELLO, builder.EndObject())
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
        return finish_frame(builder, BodyType.WELCOME, builder.EndObject())
    if isinstance(frame, Subscribe):
        pattern = builder.CreateString(frame.pattern)
        offsets = packed_vector(builder, frame.start_offsets, "q") if frame.start_offsets else 0
        queue = builder.CreateString(frame.queue) if frame.queue else 0
        builder.StartObject(8)
        builder.PrependInt64Slot(5, frame.start_time, 0)
        if queue:
            builder.PrependUOffsetTRelativeSlot(7, queue, 0)
        if offsets:
            builder.PrependUOffsetTRelativeSlot(6, offsets, 0)
        builder.PrependUint32Slot(3, frame.credit, 0)
        builder.PrependUOffsetTRelativeSlot(1, pattern, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUint8Slot(2, frame.slow_consumer, 0)
        builder.PrependUint8Slot(4, frame.start, 0)
        return finish_frame(builder, BodyType.SUBSCRIBE, builder.EndObject())
    if isinstance(frame, Error):
        message = builder.CreateString(frame.message)
        builder.StartObject(3)
        builder.PrependUOffsetTRelativeSlot(1, message, 0)
        builder.PrependUint32Slot(2, frame.stream, 0)
        builder.PrependUint16Slot(0, frame.code, 0)
        return finish_frame(builder, BodyType.ERROR, builder.EndObject())
    if isinstance(frame, Notice):
        builder.StartObject(3)
        builder.PrependUint64Slot(2, frame.count, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUint8Slot(1, frame.kind, 0)
        return finish_frame(builder, BodyType.NOTICE, builder.EndObject())
    encoded = encode_storage_frame(frame) or encode_consumer_frame(frame)
    if encoded is not None:
        return encoded
    raise LocalProtocolError(f"cannot encode {type(frame).__name__} as a control frame")


def encode_frame(frame: Frame) -> bytes:
    """Encode any frame as size-prefixed bytes, ready to write."""
    if isinstance(frame, (Publish, Deliver, Fetched)):
        chunks = [encode_chunk(run) for run in frame.runs]
        if isinstance(frame, Publish) and (frame.producer_id or frame.run_producers):
            parts = producer_frame_parts(
                frame.stream,
                chunks,
                stamp_ts_broker=frame.stamp_ts_broker,
                producer_id=frame.producer_id,
                first_sequence=frame.first_sequence,
                run_producers=frame.run_producers,
                run_sequences=frame.run_sequences,
            )
        elif isinstance(frame, Publish):
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


def _decode_run(buf: Buffer, table: int) -> Run:
    key_field, ts_field, sizes_field, messages_field, partition_field, offset_field = table_fields(
        buf, table, 6
    )
    if not (key_field and sizes_field and messages_field):
        raise malformed("run lacks a required field (key, sizes, messages)")
    key_start, key_len = vector(buf, key_field, 1)
    sizes_start, count = vector(buf, sizes_field, 4)
    messages_start, messages_len = vector(buf, messages_field, 1)
    view = memoryview(buf)
    sizes = view[sizes_start : sizes_start + 4 * count]
    if sum_u32(sizes) != messages_len:
        raise malformed("run sizes do not add up to the length of its messages")
    return Run(
        key=bytes(view[key_start : key_start + key_len]),
        ts_broker=scalar(_I64, buf, ts_field),
        count=count,
        sizes=sizes,
        messages=view[messages_start : messages_start + messages_len],
        partition=scalar(_U32, buf, partition_field),
        base_offset=scalar(_I64, buf, offset_field, -1),
    )


def _decode_runs(buf: Buffer, field: int) -> tuple[Run, ...]:
    if not field:
        return ()
    start, count = vector(buf, field, 4)
    return _runs_at(buf, start, count)


def _runs_at(buf: Buffer, start: int, count: int) -> tuple[Run, ...]:
    """The runs whose ``count`` uoffsets start at ``start`` (known to be in
    ``buf``): each read as a chunk when it is laid out as one (all at once,
    ``read_chunk_runs``), else through its vtable."""
    runs = read_chunk_runs(memoryview(buf), start, count)
    # ``all``, not ``None not in runs``: a Run is always true, and ``in``
    # would call the attrs-generated ``__eq__`` of every run (a Python call).
    if all(runs):
        return tuple(runs)  # type: ignore[arg-type]  # no None left
    slot = start
    decoded = []
    for run, offset in zip(runs, struct.unpack_from(f"<{count}I", buf, start), strict=True):
        decoded.append(_decode_run(buf, slot + offset) if run is None else run)
        slot += 4
    return tuple(decoded)


def _compiled_chunk_runs() -> Callable[[memoryview, int, int], list[Run | None]] | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    # Through ``forward``, which imports the extension (itself importing
    # ``forward``) in the order that works.
    from broky.protocol import forward  # noqa: PLC0415

    if forward.walk_compiled is None:
        return None
    from broky.protocol._forward import read_chunk_runs as compiled  # noqa: PLC0415

    return compiled


#: The compiled chunk reader (``broky.protocol._forward``) when it is built.
read_chunk_runs_compiled = _compiled_chunk_runs()
read_chunk_runs = read_chunk_runs_compiled or read_chunk_runs_pure
#: Its check that a frame's runs are all located chunks (``LocatedDeliver``).
count_located: Callable[[Buffer, int, int], int] | None = None
if read_chunk_runs_compiled is not None:
    from broky.protocol._forward import count_located


def _decode_body(buf: Buffer, body_type: int, table: int) -> Frame:  # noqa: PLR0911
    if body_type == BodyType.PUBLISH:
        stream, stamp, runs, ack, producer, first, producers, sequences = table_fields(
            buf, table, 8
        )
        publish = Publish(
            stream=scalar(_U32, buf, stream),
            runs=_decode_runs(buf, runs),
            stamp_ts_broker=bool(scalar(_U8, buf, stamp)),
            ack=bool(scalar(_U8, buf, ack)),
            producer_id=scalar(_U64, buf, producer),
            first_sequence=scalar(_U64, buf, first),
            run_producers=numbers(buf, producers, "Q"),
            run_sequences=numbers(buf, sequences, "Q"),
        )
        if (publish.run_producers or publish.run_sequences) and not (
            len(publish.run_producers) == len(publish.run_sequences) == len(publish.runs)
        ):
            raise malformed("run_producers and run_sequences need one entry per run")
        return publish
    if body_type in (BodyType.DELIVER, BodyType.FETCHED):
        stream, runs = table_fields(buf, table, 2)
        cls_runs = Deliver if body_type == BodyType.DELIVER else Fetched
        return cls_runs(stream=scalar(_U32, buf, stream), runs=_decode_runs(buf, runs))
    if body_type == BodyType.SUBSCRIBE:
        stream, pattern, policy, credit, start, start_time, offsets, queue = table_fields(
            buf, table, 8
        )
        if not pattern:
            raise malformed("subscribe lacks its pattern")
        try:
            slow_consumer = SlowConsumerPolicy(scalar(_U8, buf, policy))
            start_kind = StartKind(scalar(_U8, buf, start))
        except ValueError as exc:
            raise malformed("unknown slow-consumer policy or start position") from exc
        return Subscribe(
            stream=scalar(_U32, buf, stream),
            pattern=read_bytes(buf, pattern),
            slow_consumer=slow_consumer,
            credit=scalar(_U32, buf, credit),
            start=start_kind,
            start_time=scalar(_I64, buf, start_time),
            start_offsets=numbers(buf, offsets, "q"),
            queue=read_bytes(buf, queue),
        )
    if body_type in CONSUMER_BODIES:
        return decode_consumer_body(buf, body_type, table)
    if body_type in STORAGE_BODIES:
        return decode_storage_body(buf, body_type, table)
    if body_type in (BodyType.SUBSCRIBED, BodyType.UNSUBSCRIBE):
        (stream,) = table_fields(buf, table, 1)
        cls = Subscribed if body_type == BodyType.SUBSCRIBED else Unsubscribe
        return cls(stream=scalar(_U32, buf, stream))
    if body_type == BodyType.FLOW:
        stream, credit = table_fields(buf, table, 2)
        return Flow(stream=scalar(_U32, buf, stream), credit=scalar(_U32, buf, credit))
    if body_type in (BodyType.PING, BodyType.PONG):
        (nonce,) = table_fields(buf, table, 1)
        cls_ping = Ping if body_type == BodyType.PING else Pong
        return cls_ping(nonce=scalar(_U64, buf, nonce))
    if body_type == BodyType.HELLO:
        version, name, max_frame, link, node, user, password, token, workers = table_fields(
            buf, table, 9
        )
        try:
            link_kind = LinkKind(scalar(_U8, buf, link))
        except ValueError as exc:
            raise malformed("unknown link kind") from exc
        return Hello(
            protocol_version=scalar(_U16, buf, version, 1),
            client_name=read_text(buf, name),
            max_frame_bytes=scalar(_U32, buf, max_frame),
            link=link_kind,
            node=read_text(buf, node),
            user=read_text(buf, user),
            password=read_text(buf, password),
            token=read_text(buf, token),
            workers=scalar(_U16, buf, workers),
        )
    if body_type == BodyType.WELCOME:
        version, name, max_frame, heartbeat, idle, max_message, principal = table_fields(
            buf, table, 7
        )
        return Welcome(
            protocol_version=scalar(_U16, buf, version, 1),
            server_name=read_text(buf, name),
            max_frame_bytes=scalar(_U32, buf, max_frame),
            heartbeat_interval_ms=scalar(_U32, buf, heartbeat),
            idle_timeout_ms=scalar(_U32, buf, idle),
            max_message_bytes=scalar(_U32, buf, max_message),
            principal=read_text(buf, principal),
        )
    if body_type == BodyType.ERROR:
        code, message, stream = table_fields(buf, table, 3)
        raw_code = scalar(_U16, buf, code)
        try:
            error_code = ErrorCode(raw_code)
        except ValueError:
            error_code = ErrorCode.INTERNAL  # a newer peer's code: keep the text
        return Error(
            code=error_code, message=read_text(buf, message), stream=scalar(_U32, buf, stream)
        )
    if body_type == BodyType.NOTICE:
        stream, kind, count = table_fields(buf, table, 3)
        try:
            notice_kind = NoticeKind(scalar(_U8, buf, kind))
        except ValueError as exc:
            raise malformed("unknown notice kind") from exc
        return Notice(
            stream=scalar(_U32, buf, stream), kind=notice_kind, count=scalar(_U64, buf, count)
        )
    raise malformed(f"unknown frame body type {body_type}")


def decode_located(buf: Buffer) -> Frame | LocatedDeliver:
    """``decode_frame``, but a Deliver whose runs are all located chunks
    comes out as a ``LocatedDeliver`` where the compiled chunk reader is
    built (it checked every chunk; elsewhere every frame decodes as usual)."""
    if count_located is not None:
        try:
            head = read_runs_frame(buf)
        except struct.error:
            head = None  # decode_frame says what is wrong with it
        if head is not None and head[0] == BodyType.DELIVER:
            runs = head[4]
            messages = count_located(buf, RUNS_FRAME_RUNS_AT, runs)
            if messages >= 0:
                return LocatedDeliver(head[1], buf, RUNS_FRAME_RUNS_AT, runs, messages)
    return decode_frame(buf)


def decode_frame(buf: Buffer) -> Frame:
    """Decode one frame: the FlatBuffer after its size prefix.

    Any input either decodes or raises RemoteProtocolError; Publish and
    Deliver runs hold zero-copy views of ``buf``.
    """
    try:
        head = read_runs_frame(buf)
        if head is not None:  # the hot frames, laid out as our encoder lays them out
            body_type, stream, stamp, ack, count = head
            runs = _runs_at(buf, RUNS_FRAME_RUNS_AT, count)
            if body_type == BodyType.PUBLISH:
                return Publish(stream, runs, stamp, ack)
            return (Deliver if body_type == BodyType.DELIVER else Fetched)(stream, runs)
        if len(buf) < 8:
            raise malformed("frame shorter than a FlatBuffer root")
        root = _U32.unpack_from(buf, 0)[0]
        body_type_field, body_field = table_fields(buf, root, 2)
        if not (body_type_field and body_field):
            raise malformed("frame has no body")
        body_type = _U8.unpack_from(buf, body_type_field)[0]
        body = body_field + _U32.unpack_from(buf, body_field)[0]
        return _decode_body(buf, body_type, body)
    except struct.error as exc:
        raise malformed(str(exc)) from exc


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
