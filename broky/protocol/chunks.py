"""Run chunks: the relocatable layout the hot path forwards without re-encoding.

A chunk is one ``Run`` table laid out contiguously with its vtable and
vectors, starting 8-byte aligned, with a length that is a multiple of 8.
FlatBuffers offsets are relative, so a chunk can be copied verbatim into any
frame at an 8-aligned position: the broker takes a run's chunk once on
receipt and every subscriber's Deliver frame just concatenates chunks behind
a small header. That is what keeps fan-out cost per run, not per message.

Our publishers (the client library, the load generator) build Publish frames
out of chunks, so on receipt the broker usually finds each run already laid
out as a chunk. ``chunk_reading.read_chunk_run`` recognises that layout with one
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
from functools import partial
from operator import attrgetter
from typing import Final

from broky.compiled import compiled_twin
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
CHUNK_HEAD: Final = struct.Struct("<6HiqIIII")
#: Where the Run table starts inside a chunk.
CHUNK_TABLE_OFFSET: Final = 12
#: Where ts_broker sits inside a chunk.
CHUNK_TS_OFFSET: Final = 16
#: Where the sizes vector starts inside a chunk.
CHUNK_SIZES_AT: Final = 40

# --- Publish / Deliver header layout (offsets from the size prefix) ---------
#  0  size prefix            4  root uoffset -> 16
#  8  Frame vtable (8 bytes): body_type@8 body@4
# 16  Frame table: soffset 8, 20 body uoffset -> 40, 24 body_type, pad
# 28  body vtable (Publish 10 bytes / Deliver 8 bytes, padded to 12)
# 40  body table: soffset 12, 44 stream, 48 runs uoffset -> 56, 52 stamp flag,
#     53 ack flag (Publish with ack only)
# 56  runs vector: count, then one uoffset per run; padded to 8; chunks follow.
_RUNS_HEAD: Final = struct.Struct("<II4HiIB3x6HiIIBB2xI")
#: Where the runs vector starts, after the size prefix.
RUNS_VECTOR_AT: Final = 56
#: The root uoffset, the Frame vtable (size, table size, body_type@8, body@4),
#: the Frame table's soffset and its body uoffset.
RUNS_FRAME_ROOT_FIELDS: Final = (12, 8, 12, 8, 4, 8, 20)
#: Body vtables (each padded to 12 bytes): Publish without and with its ack
#: field, and Deliver / Fetched.
PUBLISH_VTABLE: Final = (10, 16, 4, 12, 8, 0)
PUBLISH_ACK_VTABLE: Final = (12, 16, 4, 12, 8, 13)
DELIVER_VTABLE: Final = (8, 12, 4, 8, 0, 0)


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


def _chunk_layout(
    sizes_at: int, key_len: int, sizes_len: int, messages_len: int
) -> tuple[int, int, int, int, int, int]:
    """Where a chunk's vectors lie when its size table starts at
    ``sizes_at``: the ends and starts ``_chunk_tail`` lays out, and the
    chunk's length (its last value)."""
    sizes_end = sizes_at + 4 + sizes_len
    messages_at = sizes_end + ((4 - sizes_end) & 7)  # data at messages_at + 4, 8-aligned
    messages_end = messages_at + 4 + messages_len
    key_at = (messages_end + 3) & ~3
    key_end = key_at + 4 + key_len + 1  # strings carry a NUL terminator
    return sizes_end, messages_at, messages_end, key_at, key_end, _align8(key_end)


def _chunk_tail(
    sizes_at: int, key: bytes, sizes: Buffer, messages: Buffer
) -> tuple[int, int, list[Buffer]]:
    """Lay out a chunk's vectors from ``sizes_at``: return where the messages
    vector and the key string start, and the parts after the chunk's head."""
    sizes_len = len(sizes)
    messages_len = len(messages)
    key_len = len(key)
    sizes_end, messages_at, messages_end, key_at, key_end, chunk_end = _chunk_layout(
        sizes_at, key_len, sizes_len, messages_len
    )
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
    messages_at, key_at, tail = _chunk_tail(CHUNK_SIZES_AT, key, sizes, messages)
    head = CHUNK_HEAD.pack(
        12, 28, 12, 4, 16, 20, 12, ts_broker, key_at - 24, CHUNK_SIZES_AT - 28, messages_at - 32, 0
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
_DURABLE_SHIFT: Final = _DURABLE_SIZES_AT - CHUNK_SIZES_AT
#: Where a durable chunk's size table starts, and how much longer a durable
#: chunk is than the client chunk it is made from: the compiled twin of
#: ``durable_chunk_sizes`` (broky.router.unrouted) takes them from here.
DURABLE_SIZES_AT: Final = _DURABLE_SIZES_AT
DURABLE_CHUNK_SHIFT: Final = _DURABLE_SHIFT
_CHUNK: Final = attrgetter("chunk")


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
    return head + chunk[CHUNK_SIZES_AT:]


def durable_chunk_sizes(runs: Sequence[Run]) -> list[int]:
    """``len(durable_chunk(run, ...))`` of each run without building it
    (what the router's byte figures count for stored runs no subscriber
    takes): a run that arrived as a chunk grows by the durable head's extra
    fields, any other (a piece of a run split by partition) is measured
    from its layout."""
    chunks = list(map(_CHUNK, runs))
    # ``all`` (a chunk is never empty), not ``None not in chunks``, which
    # compares every memoryview with None the slow way.
    if all(chunks):  # the usual case, in C: the runs came as chunks
        return list(map(_DURABLE_SHIFT.__add__, map(len, chunks)))
    return [
        _chunk_layout(_DURABLE_SIZES_AT, len(run.key), len(run.sizes), len(run.messages))[-1]
        if run.chunk is None
        else len(run.chunk) + _DURABLE_SHIFT
        for run in runs
    ]


def encode_chunk(run: Run) -> bytes:
    """The chunk of any run: with its offsets when it has them."""
    if run.base_offset >= 0:
        return encode_durable_run_chunk(run)
    return encode_run_chunk(run.key, run.ts_broker, run.sizes, run.messages)


def encode_run_chunk_from_pure(key: bytes, sizes: list[int], messages: list[bytes]) -> bytes:
    """The chunk of a run given as its messages' sizes and buffers (a
    publisher's open run). ``broky.protocol._vectors.encode_run_chunk_from``
    writes the same bytes into one buffer; a property test holds them equal."""
    if len(sizes) != len(messages) or any(
        size != len(message) for size, message in zip(sizes, messages, strict=True)
    ):
        raise ValueError("a run's sizes and messages disagree")
    return encode_run_chunk(key, 0, struct.pack(f"<{len(sizes)}I", *sizes), b"".join(messages))


def _compiled_run_chunk() -> Callable[[bytes, list[int], list[bytes]], bytes] | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.protocol._vectors import encode_run_chunk_from as compiled  # noqa: PLC0415
    except ImportError:
        return None  # not built, or built from older sources
    return compiled


#: The compiled encoder when it is built.
encode_run_chunk_from_compiled = _compiled_run_chunk()
encode_run_chunk_from = encode_run_chunk_from_compiled or encode_run_chunk_from_pure


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


def length_offsets_pure(lengths: bytes, position: int) -> tuple[bytes, int]:
    """:func:`chunk_offsets_pure` of chunks known by their lengths
    (``lengths``: packed little-endian uint32s)."""
    if len(lengths) % 4:
        raise ValueError("chunk lengths must be whole uint32s")
    sizes = struct.unpack(f"<{len(lengths) // 4}I", lengths)
    offsets = []
    for size in sizes:
        offsets.append(position)
        position += size - 4
    return struct.pack(f"<{len(offsets)}I", *offsets), sum(sizes)


#: :func:`length_offsets_pure` compiled (``broky.protocol._vectors``), when built.
length_offsets_compiled: Callable[[bytes, int], tuple[bytes, int]] | None = compiled_twin(
    "broky.protocol._vectors", "length_offsets"
)
length_offsets = length_offsets_compiled or length_offsets_pure


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
    parts, _ = _runs_frame(
        body_type, stream, len(chunks), partial(chunk_offsets, chunks), chunks, stamp_ts_broker, ack
    )
    return parts


def sized_runs_frame_parts(
    body_type: BodyType, stream: int, blobs: Sequence[bytes], lengths: bytes
) -> list[bytes]:
    """:func:`runs_frame_parts` of chunks given back to back in ``blobs``
    (any grouping), ``lengths`` each chunk's length in order (packed
    little-endian uint32s, as ``located.encode_located_blob`` gives them):
    the same frame, with no bytes object per chunk."""
    parts, chunk_bytes = _runs_frame(
        body_type, stream, len(lengths) // 4, partial(length_offsets, lengths), blobs, False, False
    )
    if chunk_bytes != sum(map(len, blobs)):
        raise ValueError("chunk lengths do not add up to the chunks given")
    return parts


def _runs_frame(
    body_type: BodyType,
    stream: int,
    count: int,
    offsets_from: Callable[[int], tuple[bytes, int]],
    pieces: Sequence[bytes],
    stamp_ts_broker: bool,
    ack: bool,
) -> tuple[list[bytes], int]:
    """The parts of a runs frame of ``count`` chunks given in ``pieces``,
    and the chunks' bytes; ``offsets_from(position)`` gives the runs
    vector's uoffsets (``chunk_offsets``' answer) when the first chunk's
    table is ``position`` bytes after the first uoffset."""
    vector_end = RUNS_VECTOR_AT + 4 + 4 * count
    pad = (-vector_end) & 7
    offsets, chunk_bytes = offsets_from(vector_end + pad + CHUNK_TABLE_OFFSET - RUNS_VECTOR_AT - 4)
    head = _runs_head(
        body_type, stream, count, vector_end + pad + chunk_bytes, stamp_ts_broker, ack
    )
    parts = [head, offsets, PADDING[pad]]
    parts.extend(pieces)
    return parts, chunk_bytes


def _runs_head(
    body_type: BodyType, stream: int, count: int, total: int, stamp_ts_broker: bool, ack: bool
) -> bytes:
    """A runs frame's bytes up to its runs vector (``total`` bytes in all)."""
    if body_type == BodyType.PUBLISH:
        vtable = PUBLISH_ACK_VTABLE if ack else PUBLISH_VTABLE
    else:
        vtable = DELIVER_VTABLE
    return _RUNS_HEAD.pack(
        total - 4,
        *RUNS_FRAME_ROOT_FIELDS,
        body_type,
        *vtable,
        12,
        stream,
        8,
        1 if stamp_ts_broker else 0,
        1 if ack else 0,
        count,
    )


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
