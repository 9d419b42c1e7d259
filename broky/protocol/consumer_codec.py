"""Encoding and decoding of the durable-subscription control frames
(``Consume``, ``Redelivered``, ``Settle``, ``Settled``,
``DeleteSubscription``, ``DeletedSubscription``; schema tables at the end
of ``schemas/broky.fbs``).

Kept beside ``codec.py`` rather than in it: these frames are small control
frames written with ``flatbuffers.Builder`` and read with the codec's
bounds-checked table helpers; only the two dispatch points in ``codec.py``
know about them.
"""

from __future__ import annotations

import struct
from operator import gt
from typing import Final

import flatbuffers

from broky.protocol.constants import (
    AdoptSetting,
    BodyType,
    DeletePhase,
    SettleKind,
    StartKind,
    SubscriptionKind,
)
from broky.protocol.frames import (
    Buffer,
    Consume,
    DeletedSubscription,
    DeleteSubscription,
    Frame,
    Redelivered,
    Settle,
    Settled,
)
from broky.protocol.tables import (
    check_parallel,
    finish_frame,
    malformed,
    numbers,
    packed_vector,
    read_bytes,
    read_text,
    scalar,
    table_fields,
)

CONSUMER_BODIES: Final = frozenset(
    (
        BodyType.CONSUME,
        BodyType.REDELIVERED,
        BodyType.SETTLE,
        BodyType.SETTLED,
        BodyType.DELETE_SUBSCRIPTION,
        BodyType.DELETED_SUBSCRIPTION,
    )
)

_U8 = struct.Struct("<B")
#: Bits of ``Consume.adopt_settings`` this code knows; others are ignored
#: (a newer client's bit can only widen what it adopts).
_ADOPTABLE: Final = int(
    AdoptSetting.ACK_TIMEOUT | AdoptSetting.MAX_DELIVERIES | AdoptSetting.BACKOFF
)
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


def encode_consumer_frame(frame: Frame) -> bytes | None:
    """The frame's bytes, or None if it is not one of this module's frames."""
    builder = flatbuffers.Builder(128)
    if isinstance(frame, Consume):
        starts = packed_vector(builder, frame.start_offsets, "q") if frame.start_offsets else 0
        backoff = packed_vector(builder, frame.backoff_ms, "I")
        pattern = builder.CreateString(frame.pattern)
        subscription = builder.CreateString(frame.subscription)
        dead_letters = (
            builder.CreateString(frame.dead_letter_topic) if frame.dead_letter_topic else 0
        )
        builder.StartObject(15)
        builder.PrependInt64Slot(11, frame.start_time, 0)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUOffsetTRelativeSlot(1, subscription, 0)
        builder.PrependUOffsetTRelativeSlot(2, pattern, 0)
        builder.PrependUint32Slot(5, frame.credit, 1000)
        builder.PrependUint32Slot(6, frame.max_in_flight, 1000)
        builder.PrependUint32Slot(7, frame.ack_timeout_ms, 30000)
        builder.PrependUint32Slot(8, frame.max_deliveries, 10)
        builder.PrependUOffsetTRelativeSlot(9, backoff, 0)
        builder.PrependInt32Slot(10, frame.priority, 0)
        if starts:
            builder.PrependUOffsetTRelativeSlot(12, starts, 0)
        if dead_letters:
            builder.PrependUOffsetTRelativeSlot(13, dead_letters, 0)
        builder.PrependUint8Slot(3, frame.kind, 0)
        builder.PrependUint8Slot(4, frame.start, 0)
        builder.PrependUint8Slot(14, frame.adopt_settings, 0)
        return finish_frame(builder, BodyType.CONSUME, builder.EndObject())
    if isinstance(frame, DeleteSubscription | DeletedSubscription):
        return _encode_deletion(builder, frame)
    return None


def _encode_deletion(
    builder: flatbuffers.Builder, frame: DeleteSubscription | DeletedSubscription
) -> bytes:
    """The deletion request and its answer (kept apart: one return per frame
    type in ``encode_consumer_frame`` is its limit)."""
    if isinstance(frame, DeleteSubscription):
        pattern = builder.CreateString(frame.pattern) if frame.pattern else 0
        subscription = builder.CreateString(frame.subscription)
        builder.StartObject(5)
        builder.PrependUint32Slot(0, frame.stream, 0)
        builder.PrependUOffsetTRelativeSlot(1, subscription, 0)
        if pattern:
            builder.PrependUOffsetTRelativeSlot(2, pattern, 0)
        builder.PrependBoolSlot(3, frame.force, False)
        builder.PrependUint8Slot(4, frame.phase, 0)
        return finish_frame(builder, BodyType.DELETE_SUBSCRIPTION, builder.EndObject())
    builder.StartObject(3)
    builder.PrependUint32Slot(0, frame.stream, 0)
    builder.PrependUint32Slot(1, frame.partitions, 0)
    builder.PrependUint32Slot(2, frame.consumers, 0)
    return finish_frame(builder, BodyType.DELETED_SUBSCRIPTION, builder.EndObject())


def _enum(
    kind: type[SubscriptionKind | SettleKind | StartKind | DeletePhase], value: int, what: str
) -> int:
    try:
        return int(kind(value))
    except ValueError:
        raise malformed(f"unknown {what} {value}") from None


def decode_consumer_body(buf: Buffer, body_type: int, table: int) -> Frame:
    """Decode one of ``CONSUMER_BODIES``; RemoteProtocolError if malformed."""
    if body_type == BodyType.CONSUME:
        fields = table_fields(buf, table, 15)
        if not (fields[1] and fields[2]):
            raise malformed("Consume needs subscription and pattern")
        return Consume(
            stream=scalar(_U32, buf, fields[0]),
            subscription=read_text(buf, fields[1]),
            pattern=read_bytes(buf, fields[2]),
            kind=SubscriptionKind(_enum(SubscriptionKind, scalar(_U8, buf, fields[3]), "kind")),
            start=StartKind(_enum(StartKind, scalar(_U8, buf, fields[4]), "start")),
            credit=scalar(_U32, buf, fields[5], 1000),
            max_in_flight=scalar(_U32, buf, fields[6], 1000),
            ack_timeout_ms=scalar(_U32, buf, fields[7], 30000),
            max_deliveries=scalar(_U32, buf, fields[8], 10),
            backoff_ms=numbers(buf, fields[9], "I"),
            priority=scalar(_I32, buf, fields[10]),
            start_time=scalar(_I64, buf, fields[11]),
            start_offsets=numbers(buf, fields[12], "q"),
            dead_letter_topic=read_text(buf, fields[13]),
            adopt_settings=scalar(_U8, buf, fields[14]) & _ADOPTABLE,
        )
    if body_type == BodyType.REDELIVERED:
        stream, partitions, offsets, counts, topic = table_fields(buf, table, 5)
        redelivered = Redelivered(
            stream=scalar(_U32, buf, stream),
            partitions=numbers(buf, partitions, "I"),
            offsets=numbers(buf, offsets, "q"),
            counts=numbers(buf, counts, "I"),
            topic=read_text(buf, topic),
        )
        check_parallel(
            "redelivered", redelivered.partitions, redelivered.offsets, redelivered.counts
        )
        return redelivered
    if body_type == BodyType.SETTLE:
        fields = table_fields(buf, table, 9)
        settle = Settle(
            stream=scalar(_U32, buf, fields[0]),
            sequence=scalar(_U64, buf, fields[1]),
            kind=SettleKind(_enum(SettleKind, scalar(_U8, buf, fields[2]), "settle kind")),
            partitions=numbers(buf, fields[3], "I"),
            first_offsets=numbers(buf, fields[4], "q"),
            last_offsets=numbers(buf, fields[5], "q"),
            delay_ms=scalar(_I64, buf, fields[6], -1),
            reason=read_text(buf, fields[7]),
            topic=read_text(buf, fields[8]),
        )
        check_parallel("settle", settle.partitions, settle.first_offsets, settle.last_offsets)
        # At C speed: a key-shared consumer's settle holds a range per acked run or two.
        if any(map(gt, settle.first_offsets, settle.last_offsets)):
            raise malformed("a settle range ends before it starts")
        return settle
    if body_type == BodyType.DELETE_SUBSCRIPTION:
        stream, subscription, pattern, force, phase = table_fields(buf, table, 5)
        if not subscription:
            raise malformed("DeleteSubscription needs subscription")
        return DeleteSubscription(
            stream=scalar(_U32, buf, stream),
            subscription=read_text(buf, subscription),
            pattern=read_bytes(buf, pattern),
            force=bool(scalar(_U8, buf, force)),
            phase=DeletePhase(_enum(DeletePhase, scalar(_U8, buf, phase), "delete phase")),
        )
    if body_type == BodyType.DELETED_SUBSCRIPTION:
        stream, partitions, consumers = table_fields(buf, table, 3)
        return DeletedSubscription(
            stream=scalar(_U32, buf, stream),
            partitions=scalar(_U32, buf, partitions),
            consumers=scalar(_U32, buf, consumers),
        )
    stream, sequence, stale, unconfirmed = table_fields(buf, table, 4)
    return Settled(
        stream=scalar(_U32, buf, stream),
        sequence=scalar(_U64, buf, sequence),
        stale=scalar(_U32, buf, stale),
        unconfirmed=scalar(_U32, buf, unconfirmed),
    )
