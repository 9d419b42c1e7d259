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


#: Most entries a PublishAck may have for its encoding to come from a
#: template (``_ack_template``): a client's acked frame has an entry per run,
#: typically one to a few; the cache holds at most 4 templates per count
#: (stream and sequence zero or not), each ~100 bytes plus 32 per entry.
ACK_TEMPLATE_MAX_ENTRIES: Final = 16

#: Sentinels the template is built with, found again to learn where each
#: field lands: no zero byte, none a byte pattern of another (``where``
#: checks each is found once).
_SEQUENCE_MARK: Final = 0x3344_5566_7788_9911
_STREAM_MARK: Final = 0xC7D8_E9F1
_OFFSET_MARKS: Final = (0x1122_3344_5566_7780, 0x2233_4455_6677_8890)
_RUN_MARK: Final = 0xA1B2_C3D0
_PARTITION_MARK: Final = 0xB4C5_D6E0


class _AckTemplate:
    """A PublishAck's bytes for one shape, and where its values go."""

    __slots__ = ("data", "first", "last", "partitions", "runs", "sequence", "stream", "vector")

    def __init__(self, count: int, stream: bool, sequence: bool) -> None:
        marks = PublishAck(
            stream=_STREAM_MARK if stream else 0,
            sequence=_SEQUENCE_MARK if sequence else 0,
            runs=tuple(_RUN_MARK + i for i in range(count)),
            partitions=tuple(_PARTITION_MARK + i for i in range(count)),
            first_offsets=tuple(_OFFSET_MARKS[0] + i for i in range(count)),
            last_offsets=tuple(_OFFSET_MARKS[1] + i for i in range(count)),
        )
        data = _build_storage_frame(marks)
        assert data is not None
        self.data: bytes = data
        self.vector = struct.Struct(f"<{count}q"), struct.Struct(f"<{count}I")

        def where(packed: bytes) -> int:
            position = self.data.find(packed)
            if position < 0 or self.data.find(packed, position + 1) >= 0:
                raise AssertionError("an ack template's sentinel is not unique")
            return position

        self.stream = where(_U32.pack(_STREAM_MARK)) if stream else -1
        self.sequence = where(_U64.pack(_SEQUENCE_MARK)) if sequence else -1
        self.runs = where(self.vector[1].pack(*marks.runs)) if count else -1
        self.partitions = where(self.vector[1].pack(*marks.partitions)) if count else -1
        self.first = where(self.vector[0].pack(*marks.first_offsets)) if count else -1
        self.last = where(self.vector[0].pack(*marks.last_offsets)) if count else -1

    def fill(self, frame: PublishAck) -> bytes:
        data = bytearray(self.data)
        if self.stream >= 0:
            _U32.pack_into(data, self.stream, frame.stream)
        if self.sequence >= 0:
            _U64.pack_into(data, self.sequence, frame.sequence)
        if self.runs >= 0:
            wide, narrow = self.vector
            narrow.pack_into(data, self.runs, *frame.runs)
            narrow.pack_into(data, self.partitions, *frame.partitions)
            wide.pack_into(data, self.first, *frame.first_offsets)
            wide.pack_into(data, self.last, *frame.last_offsets)
        return bytes(data)


_ack_templates: dict[tuple[int, bool, bool], _AckTemplate] = {}


def _encode_ack(frame: PublishAck) -> bytes | None:
    """A client's PublishAck from its shape's template: byte for byte what
    the builder makes (the builder's layout depends only on the entry
    count and on which scalars are zero, omitted as defaults), at a few
    ``pack_into`` calls instead of ~50 us of pure-Python builder calls per
    ack on the 2-core benchmark machine: a leader encodes one per acked
    client frame. None for what templates do not cover (refusals, many
    entries, a count that does not add up, a value out of its type's range)."""
    count = len(frame.runs)
    if (
        frame.refused_runs
        or count > ACK_TEMPLATE_MAX_ENTRIES
        or not count == len(frame.partitions) == len(frame.first_offsets) == len(frame.last_offsets)
    ):
        return None
    key = (count, frame.stream != 0, frame.sequence != 0)
    template = _ack_templates.get(key)
    if template is None:
        template = _ack_templates[key] = _AckTemplate(*key)
    try:
        return template.fill(frame)
    except struct.error:
        return None  # out of range: the builder raises its own error


def encode_storage_frame(frame: Frame) -> bytes | None:
    """Encode one of these frames; None for any other frame."""
    if isinstance(frame, PublishAck):
        return _encode_ack(frame) or _build_storage_frame(frame)
    return _build_storage_frame(frame)


def _build_storage_frame(frame: Frame) -> bytes | None:
    """``encode_storage_frame`` with the flatbuffers builder."""
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
