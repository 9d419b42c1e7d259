"""Reading run chunks and runs frames back: the fast path's recognisers.

:func:`read_chunk_run` and :func:`read_forwardable` recognise a run laid out
exactly as broky.protocol.chunks writes a chunk, :func:`read_runs_frame` a
Publish, Deliver or Fetched header laid out as ``runs_frame_parts`` writes
it: with one ``struct.unpack_from`` and a few comparisons, checking every
offset the generic decoder (``codec``) would follow, so that whatever they
accept decodes to the same result. Anything else returns None and the
caller decodes the generic way. The compiled forwarding reader
(``_forward.pyx``) compares against ``CHUNK_VTABLE`` and the frame starts
defined here.
"""

from __future__ import annotations

import struct
from typing import Final

from broky.protocol.chunks import (
    CHUNK_HEAD,
    CHUNK_SIZES_AT,
    CHUNK_TABLE_OFFSET,
    DELIVER_VTABLE,
    PUBLISH_ACK_VTABLE,
    PUBLISH_VTABLE,
    RUNS_FRAME_ROOT_FIELDS,
    RUNS_VECTOR_AT,
    sum_u32,
)
from broky.protocol.constants import BodyType
from broky.protocol.frames import Buffer, Run

#: A chunk's first 16 bytes as encode_run_chunk writes them: its vtable and
#: the table's soffset back to it.
CHUNK_VTABLE: Final = CHUNK_HEAD.pack(12, 28, 12, 4, 16, 20, 12, 0, 0, 0, 0, 0)[:16]
#: A chunk's head as read back: those 16 bytes, ts_broker, the key, sizes and
#: messages uoffsets, the padding word, the sizes vector's length and its
#: first entry (the whole vector of a run of one message).
_CHUNK_READ: Final = struct.Struct("<16sqIIIIII")
_CHUNK_READ_BYTES: Final = _CHUNK_READ.size
_CHUNK_SIZES_DATA_AT: Final = CHUNK_SIZES_AT + 4
#: The sizes uoffset (at 28) of every chunk: the sizes vector follows the table.
_CHUNK_SIZES_UOFFSET: Final = CHUNK_SIZES_AT - 28
#: A vector's length with the 4 bytes before it (padding, when there is some).
_PADDED_LENGTH: Final = struct.Struct("<II")
_U64 = struct.Struct("<Q")


def _chunk_layout(view: memoryview, start: int, size: int) -> tuple[int, ...] | None:
    """``(count, messages_at, messages_end, key_at, key_end, end, ts_broker)``
    of the chunk at ``start`` (offsets from ``start``), if ``view`` holds it
    byte for byte as :func:`encode_run_chunk` lays out a chunk; else None.

    Every offset the generic decoder would follow is checked, bounds
    included, and so are the paddings and the key's NUL (as the high bytes
    of little-endian words, which costs less than comparing slices): a
    chunk accepted here decodes to the run whose encoding it is.
    """
    if start < 0 or start + _CHUNK_READ_BYTES > size:
        return None
    head, ts_broker, key_offset, sizes_offset, messages_offset, padding, count, first = (
        _CHUNK_READ.unpack_from(view, start)
    )
    if head != CHUNK_VTABLE or sizes_offset != _CHUNK_SIZES_UOFFSET or padding:
        return None
    vectors = vectors_layout(
        view, start, size, CHUNK_SIZES_AT, count, first, key_offset + 24, messages_offset + 32
    )
    return None if vectors is None else (count, *vectors, ts_broker)


def vectors_layout(  # noqa: PLR0911
    view: memoryview,
    start: int,
    size: int,
    sizes_at: int,
    count: int,
    first: int,
    key_at_given: int,
    messages_at_given: int,
) -> tuple[int, int, int, int, int] | None:
    """``(messages_at, messages_end, key_at, key_end, end)`` of a chunk's
    vectors laid out by ``_chunk_tail`` from ``sizes_at`` (the sizes vector
    holds ``count`` entries, the first being ``first``), when the table's
    uoffsets point where that layout puts the key and the messages
    (``key_at_given``, ``messages_at_given``, from the chunk's start) and
    the paddings, the key's NUL and the size sum check out; else None.
    Both chunk layouts (ephemeral and located) share it."""
    sizes_end = sizes_at + 4 + 4 * count
    messages_at = sizes_end + ((4 - sizes_end) & 7)
    if messages_at_given != messages_at or start + messages_at + 4 > size:
        return None
    before, messages_len = _PADDED_LENGTH.unpack_from(view, start + messages_at - 4)
    if messages_at != sizes_end and before:
        return None
    messages_end = messages_at + 4 + messages_len
    key_at = (messages_end + 3) & ~3
    if key_at_given != key_at or start + key_at + 4 > size:
        return None
    before, key_len = _PADDED_LENGTH.unpack_from(view, start + key_at - 4)
    key_end = key_at + 4 + key_len
    end = (key_end + 8) & ~7  # the NUL, then padding to 8 bytes
    if (
        start + end > size
        or before >> (32 - 8 * (key_at - messages_end))
        or _U64.unpack_from(view, start + end - 8)[0] >> (64 - 8 * (end - key_end))
    ):
        return None
    if count == 1:
        if first != messages_len:
            return None
    elif sum_u32(view[start + sizes_at + 4 : start + sizes_end]) != messages_len:
        return None
    return messages_at, messages_end, key_at, key_end, end


def read_chunk_run(view: memoryview, table: int) -> Run | None:
    """The run whose table is at ``table``, if ``view`` holds it laid out as
    :func:`encode_run_chunk` lays out a chunk; None when it does not (the
    caller then reads the run through its vtable).

    When it returns a run, the generic decoder would have decoded the same
    run, and the run's ``chunk`` is the view of those bytes: forwarding a
    copy of them is exactly what encoding the run again would produce.
    """
    start = table - CHUNK_TABLE_OFFSET
    layout = _chunk_layout(view, start, len(view))
    if layout is None:
        return None
    count, messages_at, messages_end, key_at, key_end, end, ts_broker = layout
    chunk = view[start : start + end]
    return Run(
        bytes(chunk[key_at + 4 : key_end]),
        ts_broker,
        count,
        chunk[_CHUNK_SIZES_DATA_AT : _CHUNK_SIZES_DATA_AT + 4 * count],
        chunk[messages_at + 4 : messages_end],
        0,
        -1,
        chunk,
    )


#: The parts of a run chunk ``read_forwardable`` reads: its key, ts_broker,
#: message count, sizes and messages (views) and the whole chunk (a view).
ChunkParts = tuple[bytes, int, int, memoryview, memoryview, memoryview]


def read_forwardable(view: memoryview, count: int, limit: int) -> list[ChunkParts] | None:
    """The runs of a runs frame (``view`` after its size prefix, header read
    by :func:`read_runs_frame`, ``count`` runs) as chunk parts, when every
    run is laid out as a chunk and no run's messages exceed ``limit`` bytes
    in all (0: no limit); else None, and the caller decodes the frame the
    generic way (which also words any error precisely)."""
    size = len(view)
    runs: list[ChunkParts] = []
    slot = RUNS_VECTOR_AT - CHUNK_TABLE_OFFSET
    for offset in struct.unpack_from(f"<{count}I", view, RUNS_VECTOR_AT):
        start = slot + offset
        slot += 4
        layout = _chunk_layout(view, start, size)
        if layout is None:
            return None
        run_count, messages_at, messages_end, key_at, key_end, end, ts_broker = layout
        if limit and messages_end - messages_at - 4 > limit:
            return None
        runs.append(
            (
                bytes(view[start + key_at + 4 : start + key_end]),
                ts_broker,
                run_count,
                view[start + _CHUNK_SIZES_DATA_AT : start + _CHUNK_SIZES_DATA_AT + 4 * run_count],
                view[start + messages_at + 4 : start + messages_end],
                view[start : start + end],
            )
        )
    return runs


#: A runs frame's head as read back (the bytes after the size prefix): its
#: first 36 bytes (root uoffset, Frame vtable and table, body type, body
#: vtable), the body table's soffset, the stream, the runs uoffset, the two
#: flags and the runs vector's length.
_RUNS_FRAME_READ: Final = struct.Struct("<36siIIBB2xI")
#: Where the runs vector's uoffsets start, after the size prefix.
RUNS_FRAME_RUNS_AT: Final = RUNS_VECTOR_AT
#: Where the frame's stream (a u32) lies, after the size prefix: the field
#: ``_RUNS_FRAME_READ`` reads third (a relay patches it in place).
RUNS_FRAME_STREAM_AT: Final = struct.calcsize("<36si")


def _runs_frame_start(body_type: BodyType, vtable: tuple[int, ...]) -> bytes:
    return struct.pack("<I4HiIB3x6H", *RUNS_FRAME_ROOT_FIELDS, body_type, *vtable)


#: The first 36 bytes of each runs frame layout runs_frame_parts writes, and
#: what they say: the body type and whether the ack flag is a field.
_RUNS_FRAME_LAYOUTS: Final = {
    _runs_frame_start(BodyType.PUBLISH, PUBLISH_VTABLE): (BodyType.PUBLISH, False),
    _runs_frame_start(BodyType.PUBLISH, PUBLISH_ACK_VTABLE): (BodyType.PUBLISH, True),
    _runs_frame_start(BodyType.DELIVER, DELIVER_VTABLE): (BodyType.DELIVER, False),
    _runs_frame_start(BodyType.FETCHED, DELIVER_VTABLE): (BodyType.FETCHED, False),
}


#: The first 36 bytes of a Deliver frame, for the compiled forwarding reader.
DELIVER_FRAME_START: Final = _runs_frame_start(BodyType.DELIVER, DELIVER_VTABLE)
#: The first 36 bytes of an unacked Publish frame in each layout (without
#: and with its ack field), for the compiled forwarding reader.
PUBLISH_FRAME_STARTS: Final = (
    _runs_frame_start(BodyType.PUBLISH, PUBLISH_VTABLE),
    _runs_frame_start(BodyType.PUBLISH, PUBLISH_ACK_VTABLE),
)


def read_runs_frame(buf: Buffer) -> tuple[BodyType, int, bool, bool, int] | None:
    """``(body_type, stream, stamp_ts_broker, ack, run_count)`` of a Publish,
    Deliver or Fetched frame (the bytes after its size prefix) whose header
    is laid out as :func:`runs_frame_parts` lays it out; None otherwise.

    As with :func:`read_chunk_run`, a header it accepts is one the generic
    decoder reads the same way, and the ``run_count`` uoffsets at
    ``RUNS_FRAME_RUNS_AT`` lie inside ``buf``. (Deliver and Fetched have no
    flags: they read as False.)
    """
    if len(buf) < RUNS_FRAME_RUNS_AT:
        return None
    start, soffset, stream, runs_offset, stamp, ack, count = _RUNS_FRAME_READ.unpack_from(buf, 0)
    layout = _RUNS_FRAME_LAYOUTS.get(start)
    if (
        layout is None
        or soffset != 12
        or runs_offset != 8
        or RUNS_FRAME_RUNS_AT + 4 * count > len(buf)
    ):
        return None
    body_type, has_ack = layout
    if body_type != BodyType.PUBLISH:
        return body_type, stream, False, False, count
    return body_type, stream, bool(stamp), has_ack and bool(ack), count
