"""Run chunks: the relocatable layout the hot path forwards without re-encoding.

A chunk is one ``Run`` table laid out contiguously with its vtable and
vectors, starting 8-byte aligned, with a length that is a multiple of 8.
FlatBuffers offsets are relative, so a chunk can be copied verbatim into any
frame at an 8-aligned position: the broker takes a run's chunk once on
receipt and every subscriber's Deliver frame just concatenates chunks behind
a small header. That is what keeps fan-out cost per run, not per message.

Our publishers (the client library, the load generator) build Publish frames
out of chunks, so on receipt the broker usually finds each run already laid
out as a chunk. :func:`read_chunk_run` recognises that layout with one
``struct.unpack_from`` and a few comparisons, and the broker then forwards a
copy of those bytes (:func:`forward_chunk`) instead of decoding the run
through its vtable and encoding it again: that walk was most of the cost of
a short run. Any other layout (flatc's builders share one vtable between
runs, for example) is read by the generic decoder in ``codec``; the fast
readers only accept what that decoder would decode to the same result.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Final

from broky.protocol.constants import BodyType
from broky.protocol.frames import Buffer, Run

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")

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
#: The root uoffset, the Frame vtable (size, table size, body_type@8, body@4),
#: the Frame table's soffset and its body uoffset.
_RUNS_FRAME_ROOT_FIELDS: Final = (12, 8, 12, 8, 4, 8, 20)
#: Body vtables (each padded to 12 bytes): Publish without and with its ack
#: field, and Deliver / Fetched.
_PUBLISH_VTABLE: Final = (10, 16, 4, 12, 8, 0)
_PUBLISH_ACK_VTABLE: Final = (12, 16, 4, 12, 8, 13)
_DELIVER_VTABLE: Final = (8, 12, 4, 8, 0, 0)


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
    return encode_located_chunk(
        run.key, run.ts_broker, run.sizes, run.messages, run.partition, run.base_offset
    )


def encode_located_chunk(
    key: bytes, ts_broker: int, sizes: Buffer, messages: Buffer, partition: int, base_offset: int
) -> bytes:
    """:func:`encode_durable_run_chunk` from the run's fields: what a
    subscription's delivery lays out straight from a stored run, one per
    message when keys alternate, without building a ``Run`` for it."""
    messages_at, key_at, tail = _chunk_tail(_DURABLE_SIZES_AT, key, sizes, messages)
    head = _DURABLE_CHUNK_HEAD.pack(
        -36,
        ts_broker,
        base_offset,
        key_at - 32,
        _DURABLE_SIZES_AT - 36,
        messages_at - 40,
        partition,
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


#: The key and messages uoffsets of an ephemeral chunk (at 24 and 32).
_CHUNK_UOFFSETS: Final = struct.Struct("<I4xI")
#: How much further from the table a durable chunk's vectors lie.
_DURABLE_SHIFT: Final = _DURABLE_SIZES_AT - _CHUNK_SIZES_AT


def durable_chunk(run: Run, ts_broker: int, partition: int, base_offset: int) -> bytes:
    """What :func:`encode_durable_run_chunk` gives for ``run`` stamped with
    ``ts_broker`` and stored at ``base_offset`` of ``partition``.

    A run that arrived as a chunk (``run.chunk``, from :func:`read_chunk_run`)
    keeps its vectors: both layouts put them from an 8-aligned position in
    the same order with the same padding, so the durable chunk is a new head
    and a copy of the old chunk's tail, instead of a fresh layout per vector
    (a durable publish of one-message runs pays this once per message).
    """
    chunk = run.chunk
    if chunk is None:
        return encode_durable_run_chunk(
            Run(run.key, ts_broker, run.count, run.sizes, run.messages, partition, base_offset)
        )
    key_uoffset, messages_uoffset = _CHUNK_UOFFSETS.unpack_from(chunk, 24)
    head = _DURABLE_CHUNK_HEAD.pack(
        -36,
        ts_broker,
        base_offset,
        # Each uoffset grows by the shift and shrinks by the 8 bytes its
        # field moved down the table.
        key_uoffset + _DURABLE_SHIFT - 8,
        _DURABLE_SIZES_AT - 36,
        messages_uoffset + _DURABLE_SHIFT - 8,
        partition,
        16,
        36,
        20,
        4,
        24,
        28,
        32,
        12,
    )
    return head + chunk[_CHUNK_SIZES_AT:]


def encode_chunk(run: Run) -> bytes:
    """The chunk of any run: with its offsets when it has them."""
    if run.base_offset >= 0:
        return encode_durable_run_chunk(run)
    return encode_run_chunk(run.key, run.ts_broker, run.sizes, run.messages)


def chunk_offsets_pure(chunks: Sequence[bytes], position: int) -> tuple[bytes, int]:
    """The uoffsets of a runs vector whose first run's table is ``position``
    bytes after the first uoffset (packed little-endian), and the chunks'
    total length: each chunk's table is 4 bytes further from its slot than
    the chunk is long, minus the slot's own 4 bytes."""
    offsets = []
    for chunk in chunks:
        offsets.append(position)
        position += len(chunk) - 4
    return struct.pack(f"<{len(offsets)}I", *offsets), sum(len(chunk) for chunk in chunks)


def _compiled_offsets() -> Callable[[Sequence[bytes], int], tuple[bytes, int]] | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.protocol._vectors import chunk_offsets as compiled  # noqa: PLC0415
    except ImportError:
        return None
    return compiled


#: The compiled builder (``broky.protocol._vectors``) when it is built.
chunk_offsets_compiled = _compiled_offsets()
chunk_offsets = chunk_offsets_compiled or chunk_offsets_pure


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
    offsets, chunk_bytes = chunk_offsets(
        chunks, vector_end + pad + CHUNK_TABLE_OFFSET - _RUNS_VECTOR_AT - 4
    )
    total = vector_end + pad + chunk_bytes
    if body_type == BodyType.PUBLISH:
        vtable = _PUBLISH_ACK_VTABLE if ack else _PUBLISH_VTABLE
    else:
        vtable = _DELIVER_VTABLE
    head = _RUNS_HEAD.pack(
        total - 4,
        *_RUNS_FRAME_ROOT_FIELDS,
        body_type,
        *vtable,
        12,
        stream,
        8,
        1 if stamp_ts_broker else 0,
        1 if ack else 0,
        count,
    )
    parts = [head, offsets, PADDING[pad]]
    parts.extend(chunks)
    return parts


# --- reading chunks and runs frames back -------------------------------------
#: A chunk's first 16 bytes as encode_run_chunk writes them: its vtable and
#: the table's soffset back to it.
CHUNK_VTABLE: Final = _CHUNK_HEAD.pack(12, 28, 12, 4, 16, 20, 12, 0, 0, 0, 0, 0)[:16]
#: A chunk's head as read back: those 16 bytes, ts_broker, the key, sizes and
#: messages uoffsets, the padding word, the sizes vector's length and its
#: first entry (the whole vector of a run of one message).
_CHUNK_READ: Final = struct.Struct("<16sqIIIIII")
_CHUNK_READ_BYTES: Final = _CHUNK_READ.size
_CHUNK_SIZES_DATA_AT: Final = _CHUNK_SIZES_AT + 4
#: The sizes uoffset (at 28) of every chunk: the sizes vector follows the table.
_CHUNK_SIZES_UOFFSET: Final = _CHUNK_SIZES_AT - 28
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
        view, start, size, _CHUNK_SIZES_AT, count, first, key_offset + 24, messages_offset + 32
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
    slot = _RUNS_VECTOR_AT - CHUNK_TABLE_OFFSET
    for offset in struct.unpack_from(f"<{count}I", view, _RUNS_VECTOR_AT):
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
RUNS_FRAME_RUNS_AT: Final = _RUNS_VECTOR_AT


def _runs_frame_start(body_type: BodyType, vtable: tuple[int, ...]) -> bytes:
    return struct.pack("<I4HiIB3x6H", *_RUNS_FRAME_ROOT_FIELDS, body_type, *vtable)


#: The first 36 bytes of each runs frame layout runs_frame_parts writes, and
#: what they say: the body type and whether the ack flag is a field.
_RUNS_FRAME_LAYOUTS: Final = {
    _runs_frame_start(BodyType.PUBLISH, _PUBLISH_VTABLE): (BodyType.PUBLISH, False),
    _runs_frame_start(BodyType.PUBLISH, _PUBLISH_ACK_VTABLE): (BodyType.PUBLISH, True),
    _runs_frame_start(BodyType.DELIVER, _DELIVER_VTABLE): (BodyType.DELIVER, False),
    _runs_frame_start(BodyType.FETCHED, _DELIVER_VTABLE): (BodyType.FETCHED, False),
}


#: The first 36 bytes of a Deliver frame, for the compiled forwarding reader.
DELIVER_FRAME_START: Final = _runs_frame_start(BodyType.DELIVER, _DELIVER_VTABLE)
#: The first 36 bytes of an unacked Publish frame in each layout (without
#: and with its ack field), for the compiled forwarding reader.
PUBLISH_FRAME_STARTS: Final = (
    _runs_frame_start(BodyType.PUBLISH, _PUBLISH_VTABLE),
    _runs_frame_start(BodyType.PUBLISH, _PUBLISH_ACK_VTABLE),
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


def forward_chunk(run: Run, ts_broker: int = 0) -> bytes:
    """The ephemeral chunk of ``run``, with ``ts_broker`` stamped unless it is 0.

    A run read by :func:`read_chunk_run` is copied from the frame it came in
    (one copy; stamping splices the new timestamp in); any other run is
    encoded. Both give the same bytes.
    """
    chunk = run.chunk
    if chunk is None:
        return encode_run_chunk(run.key, ts_broker or run.ts_broker, run.sizes, run.messages)
    if ts_broker:
        return b"".join(
            (chunk[:CHUNK_TS_OFFSET], _I64.pack(ts_broker), chunk[CHUNK_TS_OFFSET + 8 :])
        )
    return bytes(chunk)
