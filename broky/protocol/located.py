"""Located run chunks: the runs of a durable topic's Deliver, read back
(:func:`read_located_run`) and laid out at C speed where the compiled hot
path is built (:data:`encode_located`).

A located chunk (``chunks.encode_located_chunk``) is a run chunk that also
carries the run's ``partition`` and ``base_offset``: every run a durable
subscription or a replay delivers is laid out so. Keys change on almost
every message in real traffic, so a consumer reads one of these per
message; through the generic FlatBuffers decoder (vtable walk, size sum,
one ``Run`` per field lookup) that was most of a consumer's CPU. Like
``chunks.read_chunk_run`` for ephemeral chunks, :func:`read_located_run`
recognises the exact layout with one ``struct.unpack_from`` and the checks
``chunks.vectors_layout`` shares with it, and returns what the generic
decoder would have decoded, or None (the caller then decodes generically).
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate, islice
from typing import Final

from broky.compiled import compiled_twin
from broky.protocol.chunk_reading import read_chunk_run, vectors_layout
from broky.protocol.chunks import CHUNK_TABLE_OFFSET, encode_located_chunk, u32_array
from broky.protocol.frames import Buffer, Run

#: Where a located chunk's sizes vector starts (after its table and vtable).
LOCATED_SIZES_AT: Final = 64
#: A located chunk's vtable (at 48): size 16, table size 36, then the
#: fields' offsets in the table: key 20, ts_broker 4, sizes 24, messages 28,
#: partition 32, base_offset 12.
LOCATED_VTABLE: Final = struct.pack("<8H", 16, 36, 20, 4, 24, 28, 32, 12)
#: From the table (at 12): its soffset to the vtable, ts_broker,
#: base_offset, the key, sizes and messages uoffsets, partition, the
#: vtable, the sizes vector's length and its first entry.
_LOCATED_READ: Final = struct.Struct("<iqqIIII16sII")
_LOCATED_READ_END: Final = CHUNK_TABLE_OFFSET + _LOCATED_READ.size
#: The table's soffset: the vtable lies 36 bytes after the table.
_LOCATED_SOFFSET: Final = -36
#: The sizes uoffset (at 36) of every located chunk.
_LOCATED_SIZES_UOFFSET: Final = LOCATED_SIZES_AT - 36


def read_located_run(view: memoryview, table: int) -> Run | None:
    """The run whose table is at ``table``, if ``view`` holds it laid out as
    ``encode_located_chunk`` lays out a chunk; else None.

    The run's ``chunk`` is None: a located chunk is not the ephemeral layout
    the router forwards, and a consumer never forwards it."""
    start = table - CHUNK_TABLE_OFFSET
    size = len(view)
    if start < 0 or start + _LOCATED_READ_END > size:
        return None
    (
        soffset,
        ts_broker,
        base_offset,
        key_offset,
        sizes_offset,
        messages_offset,
        partition,
        vtable,
        count,
        first,
    ) = _LOCATED_READ.unpack_from(view, table)
    if (
        soffset != _LOCATED_SOFFSET
        or vtable != LOCATED_VTABLE
        or sizes_offset != _LOCATED_SIZES_UOFFSET
    ):
        return None
    vectors = vectors_layout(
        view, start, size, LOCATED_SIZES_AT, count, first, key_offset + 32, messages_offset + 40
    )
    if vectors is None:
        return None
    messages_at, messages_end, key_at, key_end, _ = vectors
    sizes_data = start + LOCATED_SIZES_AT + 4
    return Run(
        bytes(view[start + key_at + 4 : start + key_end]),
        ts_broker,
        count,
        view[sizes_data : sizes_data + 4 * count],
        view[start + messages_at + 4 : start + messages_end],
        partition,
        base_offset,
    )


def read_chunk_runs_pure(view: memoryview, start: int, count: int) -> list[Run | None]:
    """For each of the ``count`` runs whose uoffsets start at ``start`` (known
    to lie in ``view``), the run read as an ephemeral chunk
    (``chunks.read_chunk_run``) or a located one (:func:`read_located_run`),
    or None when it is laid out neither way. The decoder of frames with runs
    (``codec._runs_at``) uses the compiled twin
    (``broky.protocol._forward.read_chunk_runs``) when it is built."""
    slot = start
    runs = []
    for offset in struct.unpack_from(f"<{count}I", view, start):
        table = slot + offset
        runs.append(read_chunk_run(view, table) or read_located_run(view, table))
        slot += 4
    return runs


def count_located_pure(view: Buffer, start: int, count: int) -> int:
    """The messages of the ``count`` runs whose uoffsets start at ``start``
    (known to lie in ``view``) when every one is a located chunk, else -1:
    the pure twin of ``broky.protocol._forward.count_located``."""
    view = memoryview(view)
    slot = start
    total = 0
    for offset in struct.unpack_from(f"<{count}I", view, start):
        run = read_located_run(view, slot + offset)
        if run is None:
            return -1
        total += run.count
        slot += 4
    return total


LocatedEncoder = Callable[[bytes, int, Buffer, Buffer, int, int], bytes]


#: Messages ahead of the walk from which :func:`encode_located_runs_pure`
#: bisects the run index for the next range's run instead of stepping over
#: the runs between (the compiled twin uses the same bound).
JUMP: Final = 16


def run_index_pure(counts: Sequence[int], key_lengths: Sequence[int], sizes: Buffer) -> bytes:
    """Where each run of a stored batch begins in its columns, as three
    columns of ``len(counts) + 1`` little-endian int64s: the run's first
    message's index, where its key begins in the keys, where its first
    message begins in the messages; each column ends with the batch's
    totals. :func:`encode_located_runs_pure` jumps through it to the run
    of a range far ahead: a key-shared consumer handed a message here and
    there across a batch of a message per run otherwise steps over every
    run in between (20 runs a message delivered, measured, when credit
    comes back in small grants)."""
    if len(key_lengths) != len(counts):
        raise ValueError("run columns of different lengths")
    table = u32_array(memoryview(sizes))
    if sum(counts) > len(table) or min(counts, default=0) < 0 or min(key_lengths, default=0) < 0:
        raise ValueError("run table runs past the batch")
    message_starts = list(accumulate(counts, initial=0))
    key_starts = list(accumulate(key_lengths, initial=0))
    byte_at = list(accumulate(table, initial=0))
    columns = array("q", message_starts)
    columns.extend(key_starts)
    columns.extend(byte_at[message] for message in message_starts)
    if sys.byteorder != "little":
        columns.byteswap()
    return columns.tobytes()


def _index_columns(run_starts: Buffer, runs: int) -> tuple[array[int], array[int], array[int]]:
    """:func:`run_index_pure`'s three columns, checked against ``runs``."""
    packed = array("q", bytes(run_starts))
    if sys.byteorder != "little":
        packed.byteswap()
    if len(packed) != 3 * (runs + 1):
        raise ValueError("a run index of another batch's length")
    size = runs + 1
    return packed[:size], packed[size : 2 * size], packed[2 * size :]


def encode_located_runs_pure(
    ts_brokers: Sequence[int],
    counts: Sequence[int],
    key_lengths: Sequence[int],
    keys: Buffer,
    sizes: Buffer,
    messages: Buffer,
    base_offset: int,
    ranges: Sequence[int],
    partition: int,
    run_starts: Buffer | None = None,
) -> list[bytes]:
    """One located chunk per run of a stored batch's columns (one entry per
    run in ``ts_brokers``, ``counts``, ``key_lengths``; ``keys``, ``sizes``,
    ``messages`` back to back, the first run at ``base_offset``) and range
    of ``ranges`` they share messages with, sliced to them, in offset order:
    a subscription's delivery straight from the columns, with no object per
    run in between (the compiled twin,
    ``broky.protocol._vectors.encode_located_runs``, is what makes that pay;
    deliveries take the chunks in one bytes, :func:`encode_located_blob_pure`).

    ``ranges`` is flat ``start, stop`` pairs of offsets, ascending and not
    overlapping: all of one consumer's deliveries from one batch in one
    call (key-shared over many keys hands a consumer a message here and
    there across a batch; a call per message was most of a delivery's cost).

    With ``run_starts``
    (:func:`run_index_pure` of these columns), a range that begins
    :data:`JUMP` or more messages ahead of the walk is reached by bisecting
    the index, not by a step per run between: the cost follows the
    messages laid out, not the stretch of the batch they are spread over."""
    if len(ranges) % 2:
        raise ValueError("ranges must be (start, stop) pairs")
    pairs = list(zip(ranges[::2], ranges[1::2], strict=True))
    table = u32_array(memoryview(sizes))
    sizes_view, messages_view, keys_view = memoryview(sizes), memoryview(messages), memoryview(keys)
    runs = len(counts)
    if len(ts_brokers) != runs or len(key_lengths) != runs:
        raise ValueError("run columns of different lengths")
    index = None if run_starts is None else _index_columns(run_starts, runs)
    chunks: list[bytes] = []
    offset = base_offset
    message = key_at = position = 0
    pair = 0
    run = 0
    while run < runs:
        while pair < len(pairs) and pairs[pair][1] <= offset:
            pair += 1
        if pair == len(pairs):
            break
        if index is not None and pairs[pair][0] - offset >= JUMP:
            message_starts, key_starts, byte_starts = index
            # The last run that begins at or before the range.
            run = max(run, bisect_right(message_starts, pairs[pair][0] - base_offset, 0, runs) - 1)
            message, key_at, position = message_starts[run], key_starts[run], byte_starts[run]
            offset = base_offset + message
        ts_broker, count, key_length = ts_brokers[run], counts[run], key_lengths[run]
        end = offset + count
        for start, stop in islice(pairs, pair, None):
            if start >= end:
                break
            first = max(start, offset) - offset
            last = min(stop, end) - offset
            if first >= last:
                continue
            at = position + sum(table[message : message + first])
            length = sum(table[message + first : message + last])
            chunks.append(
                encode_located(
                    bytes(keys_view[key_at : key_at + key_length]),
                    ts_broker,
                    sizes_view[4 * (message + first) : 4 * (message + last)],
                    messages_view[at : at + length],
                    partition,
                    offset + first,
                )
            )
        position += sum(table[message : message + count])
        offset = end
        message += count
        key_at += key_length
        run += 1
    return chunks


def encode_located_blob_pure(
    ts_brokers: Sequence[int],
    counts: Sequence[int],
    key_lengths: Sequence[int],
    keys: Buffer,
    sizes: Buffer,
    messages: Buffer,
    base_offset: int,
    ranges: Sequence[int],
    partition: int,
    run_starts: Buffer | None = None,
) -> tuple[bytes, bytes]:
    """:func:`encode_located_runs_pure`'s chunks back to back in one bytes,
    and each one's length (packed little-endian uint32s): what a delivery
    frame takes (``chunks.sized_runs_frame_parts``) without a bytes object
    per chunk. The compiled twin (``broky.protocol._vectors``) writes them
    into one buffer as it lays them out."""
    chunks = encode_located_runs_pure(
        ts_brokers,
        counts,
        key_lengths,
        keys,
        sizes,
        messages,
        base_offset,
        ranges,
        partition,
        run_starts,
    )
    return b"".join(chunks), struct.pack(f"<{len(chunks)}I", *map(len, chunks))


def _compiled_encoder() -> LocatedEncoder | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.protocol._vectors import encode_located_chunk as compiled  # noqa: PLC0415
    except ImportError:
        return None
    return compiled


#: ``chunks.encode_located_chunk`` compiled (``broky.protocol._vectors``)
#: when it is built: a subscription's delivery lays out one located chunk
#: per stored run, so one per message when keys change on every message;
#: the compiled one writes it into one buffer (about a fifth of the pure
#: one's ten-part pack and join).
encode_located_compiled = _compiled_encoder()
encode_located: LocatedEncoder = encode_located_compiled or encode_located_chunk
#: :func:`encode_located_runs_pure` compiled, when it is built.
encode_located_runs_compiled = compiled_twin("broky.protocol._vectors", "encode_located_runs")
#: :func:`run_index_pure` compiled, when it is built.
run_index_compiled = compiled_twin("broky.protocol._vectors", "run_index")
run_index: Callable[[Sequence[int], Sequence[int], Buffer], bytes] = (
    run_index_compiled or run_index_pure
)
#: :func:`encode_located_blob_pure` compiled, when it is built.
encode_located_blob_compiled = compiled_twin("broky.protocol._vectors", "encode_located_blob")
encode_located_blob = encode_located_blob_pure
if encode_located_blob_compiled is not None:
    encode_located_blob = encode_located_blob_compiled
