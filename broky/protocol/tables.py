"""Bounds-checked reading of FlatBuffers tables, and finishing a frame.

The low-level pieces every hand-written frame codec shares (``codec.py`` for
the core frames, ``consumer_codec.py`` for durable subscriptions): any bad
offset or length raises RemoteProtocolError, never a stray IndexError.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import flatbuffers

from broky.protocol.constants import BodyType, ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Buffer

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_VT_HEAD = struct.Struct("<HH")


def packed_vector(builder: flatbuffers.Builder, values: Sequence[int], code: str) -> int:
    """A vector of ``values`` as struct ``code`` (``"q"`` int64, ``"I"``
    uint32), packed in one call: the builder's per-element prepend costs
    ~1.5 us an entry, and a PublishAck (an entry per run) or a Settle (an
    entry per acked range) can hold thousands (what ``CreateByteVector``
    does, for wider elements)."""
    size = struct.calcsize(code)
    data = struct.pack(f"<{len(values)}{code}", *values)
    builder.StartVector(size, len(values), size)
    builder.head -= len(data)
    builder.Bytes[builder.head : builder.head + len(data)] = data
    return int(builder.EndVector())


def finish_frame(builder: flatbuffers.Builder, body_type: BodyType, body: int) -> bytes:
    builder.StartObject(2)
    builder.PrependUOffsetTRelativeSlot(1, body, 0)
    builder.PrependUint8Slot(0, body_type, 0)
    builder.FinishSizePrefixed(builder.EndObject())
    return bytes(builder.Output())


def malformed(what: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed frame: {what}", ErrorCode.MALFORMED_FRAME)


def table_fields(buf: Buffer, table: int, count: int) -> list[int]:
    """Absolute positions of a table's first ``count`` fields (0 = absent).

    Raises RemoteProtocolError when the table or its vtable lies outside
    ``buf``; positions of present fields are inside the table.
    """
    size = len(buf)
    if table < 0 or table + 4 > size:
        raise malformed("table offset out of bounds")
    vtable = table - _I32.unpack_from(buf, table)[0]
    if vtable < 0 or vtable + 4 > size:
        raise malformed("vtable offset out of bounds")
    vtable_size, table_size = _VT_HEAD.unpack_from(buf, vtable)
    if vtable_size < 4 or vtable_size & 1 or vtable + vtable_size > size:
        raise malformed("bad vtable size")
    if table_size < 4 or table + table_size > size:
        raise malformed("bad table size")
    present = min(count, (vtable_size - 4) >> 1)
    offsets = struct.unpack_from(f"<{present}H", buf, vtable + 4)
    fields = [0] * count
    for index, offset in enumerate(offsets):
        if offset:
            if offset < 4 or offset >= table_size:
                raise malformed("field offset outside its table")
            fields[index] = table + offset
    return fields


def vector(buf: Buffer, field: int, element_size: int) -> tuple[int, int]:
    """Return ``(start, length)`` of the vector a uoffset field points to."""
    target = field + _U32.unpack_from(buf, field)[0]
    if target + 4 > len(buf):
        raise malformed("vector offset out of bounds")
    length = _U32.unpack_from(buf, target)[0]
    start = target + 4
    if start + length * element_size > len(buf):
        raise malformed("vector runs past the end of the frame")
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
        raise malformed("string is not valid UTF-8") from exc


def scalar(unpacker: struct.Struct, buf: Buffer, field: int, default: int = 0) -> int:
    return unpacker.unpack_from(buf, field)[0] if field else default


def numbers(buf: Buffer, field: int, code: str) -> tuple[int, ...]:
    """A ``[uint32]`` (code "I"), ``[int64]`` ("q") or ``[uint64]`` ("Q") field as a tuple."""
    if not field:
        return ()
    size = struct.calcsize(code)
    start, length = vector(buf, field, size)
    return struct.unpack_from(f"<{length}{code}", buf, start)


def check_parallel(what: str, *vectors: Sequence[object]) -> None:
    """Parallel vectors (entry i of each describes one thing) must agree in length."""
    if len({len(items) for items in vectors}) > 1:
        raise malformed(f"{what} vectors differ in length")
