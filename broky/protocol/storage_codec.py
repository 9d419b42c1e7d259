"""Encoding and decoding of the durable-topic read and ack frames
(``PublishAck``, ``ListPartitions``, ``Partitions``, ``Fetch``).

Kept beside ``codec.py`` rather than in it, as ``consumer_codec.py`` is:
small control frames written with ``flatbuffers.Builder`` and read with the
codec's bounds-checked table helpers; only the two dispatch points in
``codec.py`` know about them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

import flatbuffers

from broky.protocol.constants import BodyType, ErrorCode
from broky.protocol.frames import Buffer, Fetch, Frame, ListPartitions, Partitions, PublishAck
from broky.protocol.tables import (
    check_parallel,
    finish_frame,
    malformed,
    numbers,
    packed_vector,
    read_text,
    scalar,
    table_fields,
    vector,
)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


def encode_storage_frame(frame: Frame) -> bytes | None:
    """Encode one of these frames; None for any other frame."""
    builder = flatbuffers.Builder(128)
    if isinstance(frame, PublishAck):
        refusals = None
        if frame.refused_runs:  # broker-internal: absent from every ack to a client
            refusals = (
                packed_vector(builder, frame.refused_runs, "I"),
                packed_vector(builder, frame.refused_codes, "H"),
                _strings(builder, frame.refused_reasons),
            )
        last = packed_vector(builder, frame.last_offsets, "q")
        first = packed_vector(builder, frame.first_offsets, "q")
        partitions = packed_vector(builder, frame.partitions, "I")
        runs = packed_vector(builder, frame.runs, "I")
        builder.StartObject(9)
        if refusals is not None:
            for slot, offset in enumerate(refusals, start=6):
                builder.PrependUOffsetTRelativeSlot(slot, offset, 0)
        builder.PrependUint64Slot(1, frame.sequence, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUOffsetTRelativeSlot(2, runs, 0)
        builder.PrependUOffsetTRelativeSlot(3, partitions, 0)
        builder.PrependUOffsetTRelativeSlot(4, first, 0)
        builder.PrependUOffsetTRelativeSlot(5, last, 0)
        return finish_frame(builder, BodyType.PUBLISH_ACK, builder.EndObject())
    if isinstance(frame, ListPartitions):
        topic = builder.CreateString(frame.topic)
        builder.StartObject(2)
        builder.PrependUOffsetTRelativeSlot(1, topic, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        return finish_frame(builder, BodyType.LIST_PARTITIONS, builder.EndObject())
    if isinstance(frame, Partitions):
        topics = _strings(builder, frame.topics)
        ends = packed_vector(builder, frame.end_offsets, "q")
        starts = packed_vector(builder, frame.start_offsets, "q")
        partitions = packed_vector(builder, frame.partitions, "I")
        builder.StartObject(5)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUOffsetTRelativeSlot(1, topics, 0)
        builder.PrependUOffsetTRelativeSlot(2, partitions, 0)
        builder.PrependUOffsetTRelativeSlot(3, starts, 0)
        builder.PrependUOffsetTRelativeSlot(4, ends, 0)
        return finish_frame(builder, BodyType.PARTITIONS, builder.EndObject())
    if isinstance(frame, Fetch):
        topic = builder.CreateString(frame.topic)
        builder.StartObject(5)
        builder.PrependInt64Slot(3, frame.offset, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUOffsetTRelativeSlot(1, topic, 0)
        builder.PrependUint32Slot(2, frame.partition, 0)
        builder.PrependUint32Slot(4, frame.max_bytes, 0)
        return finish_frame(builder, BodyType.FETCH, builder.EndObject())
    return None


STORAGE_BODIES: Final = frozenset(
    (BodyType.PUBLISH_ACK, BodyType.LIST_PARTITIONS, BodyType.PARTITIONS, BodyType.FETCH)
)


def decode_storage_body(buf: Buffer, body_type: int, table: int) -> Frame:
    if body_type == BodyType.PUBLISH_ACK:
        fields = table_fields(buf, table, 9)
        stream, sequence, runs, partitions, first, last, refused, codes, reasons = fields
        ack = PublishAck(
            stream=scalar(_U32, buf, stream),
            sequence=scalar(_U64, buf, sequence),
            runs=numbers(buf, runs, "I"),
            partitions=numbers(buf, partitions, "I"),
            first_offsets=numbers(buf, first, "q"),
            last_offsets=numbers(buf, last, "q"),
            refused_runs=numbers(buf, refused, "I"),
            refused_codes=tuple(_error_code(code) for code in numbers(buf, codes, "H")),
            refused_reasons=tuple(_strings_at(buf, reasons)),
        )
        check_parallel("publish ack", ack.runs, ack.partitions, ack.first_offsets, ack.last_offsets)
        check_parallel(
            "publish ack refusals", ack.refused_runs, ack.refused_codes, ack.refused_reasons
        )
        return ack
    if body_type == BodyType.LIST_PARTITIONS:
        stream, topic = table_fields(buf, table, 2)
        return ListPartitions(stream=scalar(_U32, buf, stream), topic=read_text(buf, topic))
    if body_type == BodyType.PARTITIONS:
        stream, topics_field, partitions, starts, ends = table_fields(buf, table, 5)
        answer = Partitions(
            stream=scalar(_U32, buf, stream),
            topics=tuple(_strings_at(buf, topics_field)),
            partitions=numbers(buf, partitions, "I"),
            start_offsets=numbers(buf, starts, "q"),
            end_offsets=numbers(buf, ends, "q"),
        )
        check_parallel(
            "partitions",
            answer.topics,
            answer.partitions,
            answer.start_offsets,
            answer.end_offsets,
        )
        return answer
    stream, topic, partition, offset, max_bytes = table_fields(buf, table, 5)
    return Fetch(
        stream=scalar(_U32, buf, stream),
        topic=read_text(buf, topic),
        partition=scalar(_U32, buf, partition),
        offset=scalar(_I64, buf, offset),
        max_bytes=scalar(_U32, buf, max_bytes),
    )


def _strings(builder: flatbuffers.Builder, texts: Sequence[str]) -> int:
    """A vector of strings (built before the table that holds it)."""
    offsets = [builder.CreateString(text) for text in texts]
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return int(builder.EndVector())


def _strings_at(buf: Buffer, field: int) -> list[str]:
    """The vector of strings at ``field`` (empty when absent)."""
    if not field:
        return []
    start, count = vector(buf, field, 4)
    return [
        _string_at(buf, slot + _U32.unpack_from(buf, slot)[0])
        for slot in range(start, start + 4 * count, 4)
    ]


def _error_code(raw: int) -> ErrorCode:
    """A refusal's code; a newer peer's unknown code reads as Internal (as in Error)."""
    try:
        return ErrorCode(raw)
    except ValueError:
        return ErrorCode.INTERNAL


def _string_at(buf: Buffer, position: int) -> str:
    """The string whose length prefix is at ``position`` (a vector element)."""
    if position + 4 > len(buf):
        raise malformed("string offset out of bounds")
    length = _U32.unpack_from(buf, position)[0]
    if position + 4 + length > len(buf):
        raise malformed("string runs past the end of the frame")
    try:
        return bytes(buf[position + 4 : position + 4 + length]).decode()
    except UnicodeDecodeError as exc:
        raise malformed("string is not valid UTF-8") from exc
