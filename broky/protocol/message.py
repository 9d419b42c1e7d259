"""Messages: the user-facing value type and its FlatBuffers encoding.

A message travels as its own FlatBuffer (root type ``Message``) inside a run;
the broker never looks inside it. The encoder writes one fixed layout with a
single ``struct.pack`` for the common case (payload and producer timestamp
only); the decoder reads any valid layout through the vtable.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from broky.protocol.codec import PADDING, sum_u32, u32_array
from broky.protocol.constants import UID_BYTES
from broky.protocol.errors import LocalProtocolError, RemoteProtocolError
from broky.protocol.frames import Buffer, Run
from broky.protocol.tables import table_fields, vector

Tags = tuple[tuple[str, str], ...]


class Message(NamedTuple):
    """A received message. Immutable; a NamedTuple because one is built per
    message on the receive path and a tuple is the cheapest typed value."""

    key: str
    payload: bytes
    key_partition: bytes = b""
    ts_producer: int = 0
    ts_broker: int = 0
    uid: bytes = b""
    tags: Tags = ()
    #: Durable topics only: the message's partition and offset (-1: ephemeral).
    partition: int = -1
    offset: int = -1


# Layout written by encode_message (offsets from the message start):
#  0  root uoffset -> 20        4  vtable: 14 bytes, table size 28,
#     key_partition@16 payload@12 ts_producer@4 uid@20 tags@24, then 2 pad
# 20  table: soffset 16, 24 int64 ts_producer, 32 payload, 36 key_partition,
#     40 uid, 44 tags (uoffsets); 48 vectors follow, payload first.
_FAST: Final = struct.Struct("<I7H2xiqIIIII")
_HEAD: Final = struct.Struct("<I7H2xiqIIII")
_U32 = struct.Struct("<I")
_TAG_HEAD: Final = struct.Struct("<4HiII")
_VECTORS_AT: Final = 48
#: The root uoffset and vtable of a message with a key_partition and
#: nothing else optional (``encode_message``'s second fast path).
_PARTITION_ONLY: Final = (20, 14, 28, 16, 12, 4, 0, 0, 16)


def encode_message(
    payload: bytes,
    key_partition: bytes = b"",
    ts_producer: int = 0,
    uid: bytes = b"",
    tags: Iterable[tuple[str, str]] = (),
) -> bytes:
    """Encode one message as a FlatBuffer padded to a multiple of 8 bytes."""
    payload_len = len(payload)
    if not (key_partition or uid or tags):
        end = _VECTORS_AT + 4 + payload_len
        return b"".join(
            (
                _FAST.pack(20, 14, 28, 0, 12, 4, 0, 0, 16, ts_producer, 16, 0, 0, 0, payload_len),
                payload,
                PADDING[-end & 7],
            )
        )
    if not (uid or tags):  # a key_partition alone: a distinct one per message is common
        partition_at = (_VECTORS_AT + 4 + payload_len + 3) & ~3
        end = partition_at + 4 + len(key_partition)
        return b"".join(
            (
                _FAST.pack(*_PARTITION_ONLY, ts_producer, 16, partition_at - 36, 0, 0, payload_len),
                payload,
                PADDING[partition_at - (_VECTORS_AT + 4 + payload_len)],
                _U32.pack(len(key_partition)),
                key_partition,
                PADDING[-end & 7],
            )
        )
    return encode_message_fields(payload, key_partition, ts_producer, uid, tags)


def encode_message_fields(
    payload: bytes,
    key_partition: bytes = b"",
    ts_producer: int = 0,
    uid: bytes = b"",
    tags: Iterable[tuple[str, str]] = (),
) -> bytes:
    """``encode_message`` field by field, whatever fields are set: the
    general layout, which its fast paths reproduce byte for byte (tests)."""
    if uid and len(uid) != UID_BYTES:
        raise LocalProtocolError(f"uid must be {UID_BYTES} bytes (a KSUID), got {len(uid)}")
    parts: list[bytes] = []
    position = _VECTORS_AT

    def add_vector(data: bytes, slot: int) -> int:
        nonlocal position
        offset = position - slot
        parts.append(_U32.pack(len(data)))
        parts.append(data)
        position += 4 + len(data)
        parts.append(PADDING[-position & 3])
        position += -position & 3
        return offset

    payload_offset = add_vector(payload, 32)
    kp_offset = add_vector(key_partition, 36) if key_partition else 0
    uid_offset = add_vector(uid, 40) if uid else 0
    tag_list = list(tags)
    tags_offset = 0
    if tag_list:
        tags_offset = position - 44
        vector_at = position
        position += 4 + 4 * len(tag_list)
        blocks: list[bytes] = []
        offsets: list[int] = []
        for index, (name, value) in enumerate(tag_list):
            name_bytes, value_bytes = name.encode(), value.encode()
            table_at = position + 8
            name_at = table_at + 12
            value_at = (name_at + 4 + len(name_bytes) + 1 + 3) & ~3
            block_end = (value_at + 4 + len(value_bytes) + 1 + 3) & ~3
            offsets.append(table_at - (vector_at + 4 + 4 * index))
            blocks.append(
                b"".join(
                    (
                        _TAG_HEAD.pack(
                            8, 12, 4, 8, 8, name_at - (table_at + 4), value_at - (table_at + 8)
                        ),
                        _U32.pack(len(name_bytes)),
                        name_bytes,
                        PADDING[value_at - (name_at + 4 + len(name_bytes))],
                        _U32.pack(len(value_bytes)),
                        value_bytes,
                        PADDING[block_end - (value_at + 4 + len(value_bytes))],
                    )
                )
            )
            position = block_end
        parts.append(struct.pack(f"<{len(tag_list) + 1}I", len(tag_list), *offsets))
        parts.extend(blocks)
    parts.append(PADDING[-position & 7])
    head = _HEAD.pack(
        20,
        14,
        28,
        16 if key_partition else 0,
        12,
        4,
        20 if uid else 0,
        24 if tag_list else 0,
        16,
        ts_producer,
        payload_offset,
        kp_offset,
        uid_offset,
        tags_offset,
    )
    return head + b"".join(parts)


def _text(buf: memoryview, field: int) -> str:
    start, length = vector(buf, field, 1)
    try:
        return bytes(buf[start : start + length]).decode()
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError("malformed message: tag is not valid UTF-8") from exc


def _bytes(buf: memoryview, field: int) -> bytes:
    if not field:
        return b""
    start, length = vector(buf, field, 1)
    return bytes(buf[start : start + length])


def decode_message(
    buf: memoryview, key: str, ts_broker: int, partition: int = -1, offset: int = -1
) -> Message:
    """Decode one message FlatBuffer (exactly the bytes of one message)."""
    try:
        kp_field, payload_field, ts_field, uid_field, tags_field = table_fields(
            buf, _U32.unpack_from(buf, 0)[0], 5
        )
        tags: Tags = ()
        if tags_field:
            start, count = vector(buf, tags_field, 4)
            decoded = []
            for slot in range(start, start + 4 * count, 4):
                tag = slot + _U32.unpack_from(buf, slot)[0]
                name_field, value_field = table_fields(buf, tag, 2)
                if not name_field:
                    raise RemoteProtocolError("malformed message: tag without a key")
                value = _text(buf, value_field) if value_field else ""
                decoded.append((_text(buf, name_field), value))
            tags = tuple(decoded)
        return Message(
            key,
            _bytes(buf, payload_field),
            _bytes(buf, kp_field),
            struct.unpack_from("<q", buf, ts_field)[0] if ts_field else 0,
            ts_broker,
            _bytes(buf, uid_field),
            tags,
            partition,
            offset,
        )
    except struct.error as exc:
        raise RemoteProtocolError(f"malformed message: {exc}") from exc


def message_views(run: Run) -> list[memoryview]:
    """Split a run's messages into one view per message."""
    view = memoryview(run.messages)
    views = []
    position = 0
    for size in u32_array(memoryview(run.sizes)):
        views.append(view[position : position + size])
        position += size
    return views


def decode_run(run: Run) -> list[Message]:
    """Decode every message of a run; raises RemoteProtocolError on the first bad one."""
    key = run.key.decode(errors="replace")
    ts_broker = run.ts_broker
    base = run.base_offset
    if base < 0:
        return [decode_message(view, key, ts_broker) for view in message_views(run)]
    partition = run.partition
    return [
        decode_message(view, key, ts_broker, partition, base + index)
        for index, view in enumerate(message_views(run))
    ]


def pack_sizes(sizes: Sequence[int]) -> bytes:
    """The little-endian uint32 size table of a run."""
    if len(sizes) == 1:  # a run of one message: a key per message is common
        return _U32.pack(sizes[0])
    return struct.pack(f"<{len(sizes)}I", *sizes)


def check_sizes(sizes: Buffer, messages: Buffer) -> None:
    """Raise LocalProtocolError unless the size table matches the messages."""
    if len(sizes) % 4 or sum_u32(memoryview(sizes)) != len(messages):
        raise LocalProtocolError("run sizes do not add up to the length of its messages")
