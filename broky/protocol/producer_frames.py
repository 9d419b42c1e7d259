"""Publish frames of idempotent producers: the runs layout plus producer fields.

An acked Publish from an idempotent producer carries ``producer_id`` and
``first_sequence`` (the client library's frames), or per-run
``run_producers`` and ``run_sequences`` (frames the broker forwards between
workers, which gather runs of many producers). Such frames are built here
the way ``runs_frame_parts`` builds the hot frames: a fixed header written
with one ``struct.pack``, the run chunks copied verbatim behind it, and the
two optional vectors after the chunks. They are not on the hot unacked path,
so the receiver reads them with the generic vtable decoder (a few
microseconds per frame, whatever its number of runs) while their runs are
still read as chunks.

Layout (offsets from the size prefix; FlatBuffers-valid, 8-aligned like the
runs frames)::

     0  size prefix            4  root uoffset -> 16
     8  Frame vtable           16 Frame table (body uoffset at 20 -> 48,
                                  body_type at 24)
    28  Publish vtable (20 bytes: 8 fields)
    48  Publish table: soffset, 52 stream, 56 runs uoffset, 60 stamp,
        61 ack, 64 producer_id, 72 first_sequence, 80 run_producers uoffset,
        84 run_sequences uoffset
    88  runs vector (count, uoffsets), padded to 8; the chunks;
        then each present u64 vector (4 bytes of padding, length, entries)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from broky.protocol.chunks import CHUNK_TABLE_OFFSET, PADDING, chunk_offsets
from broky.protocol.constants import BodyType

#: Root uoffset, the Frame vtable, the Frame table's soffset and its body
#: uoffset (28: the body table at 48), as ``runs_frame_parts`` writes them
#: but for the body's place.
_ROOT_FIELDS: Final = (12, 8, 12, 8, 4, 8, 28)
_HEAD: Final = struct.Struct("<II4HiIB3x10HiIIBB2xQQIII")
_TABLE_AT: Final = 48
_TABLE_BYTES: Final = 40
_VTABLE_AT: Final = 28
_RUNS_VECTOR_AT: Final = _TABLE_AT + _TABLE_BYTES
#: Field offsets in the table: stream, stamp, runs, ack, producer_id,
#: first_sequence (run_producers and run_sequences are 32 and 36, or 0 when absent).
_FIELDS: Final = (4, 12, 8, 13, 16, 24)


def producer_frame_parts(
    stream: int,
    chunks: Sequence[bytes],
    *,
    stamp_ts_broker: bool = False,
    producer_id: int = 0,
    first_sequence: int = 0,
    run_producers: Sequence[int] = (),
    run_sequences: Sequence[int] = (),
) -> list[bytes]:
    """The parts of an acked Publish frame with producer fields (module docstring).

    ``chunks`` come from ``encode_run_chunk``; ``run_producers`` and
    ``run_sequences``, when given, have one entry per chunk.
    """
    count = len(chunks)
    vector_end = _RUNS_VECTOR_AT + 4 + 4 * count
    pad = (-vector_end) & 7
    offsets, chunk_bytes = chunk_offsets(
        chunks, vector_end + pad + CHUNK_TABLE_OFFSET - _RUNS_VECTOR_AT - 4
    )
    chunks_end = vector_end + pad + chunk_bytes
    tail: list[bytes] = []
    producers_uoffset = sequences_uoffset = 0
    total = chunks_end
    if run_producers:
        vector_bytes = 8 + 8 * count
        producers_uoffset = total + 4 - (_TABLE_AT + 32)
        sequences_uoffset = total + vector_bytes + 4 - (_TABLE_AT + 36)
        tail = [
            struct.pack(f"<4xI{count}Q", count, *values)
            for values in (run_producers, run_sequences)
        ]
        total += 2 * vector_bytes
    head = _HEAD.pack(
        total - 4,
        *_ROOT_FIELDS,
        BodyType.PUBLISH,
        20,
        _TABLE_BYTES,
        *_FIELDS,
        32 if run_producers else 0,
        36 if run_producers else 0,
        _TABLE_AT - _VTABLE_AT,
        stream,
        _RUNS_VECTOR_AT - (_TABLE_AT + 8),
        1 if stamp_ts_broker else 0,
        1,
        producer_id,
        first_sequence,
        producers_uoffset,
        sequences_uoffset,
        count,
    )
    return [head, offsets, PADDING[pad], *chunks, *tail]
