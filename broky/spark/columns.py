"""The connector's row layout and a columnar decoder from stored runs to Arrow.

Spark's Python data sources hand rows to the JVM as Arrow; building Arrow
columns straight from the runs' bytes is what makes a batch read fast (a
Python object per message would cap it near 300k rows/s per core). Up to
``BATCH_ROWS`` messages are decoded in one numpy pass when they have the
layout ``encode_message`` writes when only payload and ``ts_producer`` are
set (the common case); any other layout (key_partition, uid or tags
present, or another FlatBuffers writer) goes through ``decode_message`` one
message at a time.

The Arrow schema is derived from the Spark schema, nullability included,
because Spark rejects batches whose schema differs in any way.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, chain
from operator import attrgetter
from typing import Final, cast

import attrs
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broky.protocol.codec import u32_array
from broky.protocol.frames import Run
from broky.protocol.message import decode_message
from broky.storage.batch_reading import RecordBatch

#: What a read yields, one row per message. Absent optional fields
#: (key_partition, uid, a zero timestamp) are null; tags are never null.
READ_SCHEMA: Final = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("key", StringType(), False),
        StructField("key_partition", BinaryType(), True),
        StructField("payload", BinaryType(), False),
        StructField("ts_producer", TimestampType(), True),
        StructField("ts_broker", TimestampType(), True),
        StructField("uid", BinaryType(), True),
        StructField("tags", MapType(StringType(), StringType(), False), False),
    ]
)
ARROW_SCHEMA: Final = to_arrow_schema(READ_SCHEMA, timezone="UTC")
_TIMESTAMP: Final = ARROW_SCHEMA.field("ts_broker").type
_TAGS: Final = ARROW_SCHEMA.field("tags").type

#: Rows per Arrow batch handed to Spark. Measured with bench_spark on
#: local[2] (2 cores): 8k rows read ~2x faster than 64k (the JVM converts a
#: batch while the Python worker decodes the next, and 8k rows of 100-byte
#: messages stay in cache); 4k rows lose again to per-batch costs.
BATCH_ROWS: Final = 8_192
#: Message bytes per Arrow batch at most: Arrow's binary offsets are 32-bit,
#: so large messages must not gather 2 GiB of payload in one batch.
BATCH_BYTES: Final = 64 * 1024 * 1024

# The fixed layout of encode_message's fast path: bytes [0, 24) and [32, 48)
# are constant (root offset, vtable, soffset, field offsets with
# key_partition, uid and tags absent); ts_producer is at 24, the payload's
# length at 48 and its bytes from 52.
_FAST_HEAD: Final = np.frombuffer(
    struct.pack("<I7H2xiqIIIII", 20, 14, 28, 0, 12, 4, 0, 0, 16, 0, 16, 0, 0, 0, 0), np.uint8
)
_FAST_CONSTANT: Final = np.r_[0:24, 32:48]
_FAST_HEAD_BYTES: Final = 52


@attrs.frozen
class RunColumns:
    """Consecutive runs of one partition as columns, ready for :func:`_to_batch`.

    Per run: message count, first offset, ``ts_broker`` and key length; then
    the keys, the size tables and the messages back to back. A stored batch
    of many runs (``broky.storage.batch_reading.RecordBatch``) becomes one of these
    without a Python step per run, which is what keeps a log written one
    message per key as fast to read as one written in long runs. The
    per-run columns stay Python sequences (a batch's are the tuples its run
    table unpacked to) and become numpy arrays once per Arrow batch in
    :func:`_to_batch`: a log written in small group commits (a busy broker
    with ``fsync = "always"`` stores a few dozen runs per batch) then costs
    no numpy setup per stored batch.
    """

    counts: Sequence[int]
    bases: Sequence[int]
    ts_brokers: Sequence[int]
    key_lengths: Sequence[int]
    keys: bytes
    sizes: bytes
    messages: bytes
    #: Messages of all the runs (the sum of ``counts``).
    rows: int

    @classmethod
    def of_runs(cls, runs: Sequence[Run]) -> RunColumns:
        """Runs that each carry their ``base_offset``."""
        keys = [bytes(run.key) for run in runs]
        counts = [run.count for run in runs]
        return cls(
            counts,
            [run.base_offset for run in runs],
            [run.ts_broker for run in runs],
            [len(key) for key in keys],
            b"".join(keys),
            b"".join([bytes(run.sizes) for run in runs]),
            b"".join([bytes(run.messages) for run in runs]),
            sum(counts),
        )

    @classmethod
    def of_batch(cls, batch: RecordBatch) -> RunColumns:
        """Every run of a stored batch."""
        counts = batch.counts
        return cls(
            counts,
            list(accumulate(counts[:-1], initial=batch.base_offset)),
            batch.ts_brokers,
            batch.key_lengths,
            bytes(batch.keys),
            bytes(batch.sizes),
            bytes(batch.messages),
            batch.count,
        )


def _to_batch(topic: bytes, partition: int, pieces: Sequence[RunColumns]) -> pa.RecordBatch:
    """One Arrow batch of ``ARROW_SCHEMA`` from consecutive runs of a partition.

    All the runs' messages are decoded in one vectorised pass, so that small
    runs (a key that changes every message) cost no more per message than
    large ones; messages not in the fast layout are decoded one by one and
    their payloads appended after the others.
    """
    counts = _column(pieces, _COUNTS)
    run_ts = _column(pieces, _TS_BROKERS)
    rows = int(counts.sum())
    sizes = np.frombuffer(b"".join([piece.sizes for piece in pieces]), "<u4").astype(np.int64)
    # Zero padding lets the head gather below run past a short last message.
    messages = b"".join([*(piece.messages for piece in pieces), bytes(_FAST_HEAD_BYTES)])
    buffer = np.frombuffer(messages, np.uint8)
    starts = np.zeros(rows, np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    heads = _heads(buffer, starts)
    ts_producer = heads[:, 24:32].copy().view("<i8").ravel()
    lengths = heads[:, 48:52].copy().view("<u4").ravel().astype(np.int64)
    fast = (heads[:, _FAST_CONSTANT] == _FAST_HEAD[_FAST_CONSTANT]).all(axis=1)
    fast &= lengths + _FAST_HEAD_BYTES <= sizes
    payload_starts = starts + _FAST_HEAD_BYTES
    key_partition: pa.Array = pa.nulls(rows, pa.binary())
    uid: pa.Array = pa.nulls(rows, pa.binary())
    tags: pa.Array = pa.MapArray.from_arrays(
        np.zeros(rows + 1, np.int32),
        pa.array([], pa.string()),
        pa.array([], pa.string()),
        type=_TAGS,
    )
    run_of_row = np.repeat(np.arange(len(counts)), counts)
    slow_rows = np.flatnonzero(~fast)
    if len(slow_rows):
        key_partitions: list[bytes | None] = [None] * rows
        uids: list[bytes | None] = [None] * rows
        tag_lists: list[list[tuple[str, str]]] = [[] for _ in range(rows)]
        extra: list[bytes] = []
        extra_at = len(messages)
        message_view = memoryview(messages)
        for row in slow_rows.tolist():
            start = int(starts[row])
            message = decode_message(
                message_view[start : start + int(sizes[row])], "", int(run_ts[run_of_row[row]])
            )
            ts_producer[row] = message.ts_producer
            lengths[row] = len(message.payload)
            payload_starts[row] = extra_at
            extra.append(message.payload)
            extra_at += len(message.payload)
            key_partitions[row] = message.key_partition or None
            uids[row] = message.uid or None
            tag_lists[row] = list(message.tags)
        messages += b"".join(extra)
        key_partition = pa.array(key_partitions, pa.binary())
        uid = pa.array(uids, pa.binary())
        tags = pa.array(tag_lists, _TAGS)
    # Slicing and joining in Python beats a byte-level numpy gather here:
    # one slice per message instead of an index per payload byte.
    payload_ends = (payload_starts + lengths).tolist()
    payloads = b"".join(
        map(messages.__getitem__, map(slice, payload_starts.tolist(), payload_ends))
    )
    # Each run's offsets count up from its base: base - (rows before it) + row.
    run_firsts = np.cumsum(counts) - counts
    bases = _column(pieces, _BASES)
    offsets = np.repeat(bases - run_firsts, counts) + np.arange(rows, dtype=np.int64)
    columns = [
        _repeated_text([topic], [rows]),
        pa.array(np.full(rows, partition, np.int32)),
        pa.array(offsets),
        _keys(pieces, run_of_row, rows),
        key_partition,
        _binary(lengths, payloads),
        _timestamps(ts_producer),
        _timestamps(run_ts[run_of_row]),
        uid,
        tags,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _column(
    pieces: Sequence[RunColumns], field: attrgetter[Sequence[int]]
) -> npt.NDArray[np.int64]:
    """One per-run column of every piece, as one array."""
    return np.fromiter(chain.from_iterable(map(field, pieces)), np.int64)


_COUNTS: Final = attrgetter("counts")
_BASES: Final = attrgetter("bases")
_TS_BROKERS: Final = attrgetter("ts_brokers")
_KEY_LENGTHS: Final = attrgetter("key_lengths")


def _keys(pieces: Sequence[RunColumns], run_of_row: npt.NDArray[np.int64], rows: int) -> pa.Array:
    """The key column: each run's key on each of its rows, built from the
    keys' buffer (one gather, not a string per row)."""
    keys = b"".join([piece.keys for piece in pieces])
    key_lengths = _column(pieces, _KEY_LENGTHS)
    if not keys.isascii():
        # Keys are UTF-8 on the wire; a broken one must not break the column.
        starts = (np.cumsum(key_lengths) - key_lengths).tolist()
        texts = [
            keys[start : start + length].decode(errors="replace").encode()
            for start, length in zip(starts, key_lengths.tolist(), strict=True)
        ]
        keys = b"".join(texts)
        key_lengths = np.array([len(text) for text in texts], np.int64)
    offsets = np.zeros(len(key_lengths) + 1, np.int32)
    np.cumsum(key_lengths, out=offsets[1:])
    run_keys = pa.StringArray.from_buffers(
        len(key_lengths), pa.py_buffer(offsets), pa.py_buffer(keys)
    )
    if len(key_lengths) == rows:
        return run_keys  # one message per run
    return run_keys.take(pa.array(run_of_row))


def _heads(buffer: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """The first ``_FAST_HEAD_BYTES`` of every message, one row each. Messages
    from ``encode_message`` start 4-aligned, which lets the gather move
    words rather than bytes (4x fewer indexes)."""
    if (starts & 3).any():
        return cast("npt.NDArray[np.uint8]", buffer[starts[:, None] + np.arange(_FAST_HEAD_BYTES)])
    words = buffer[: len(buffer) & ~3].view("<u4")
    gathered = words[(starts >> 2)[:, None] + np.arange(_FAST_HEAD_BYTES // 4)]
    return cast(
        "npt.NDArray[np.uint8]", gathered.view(np.uint8).reshape(len(starts), _FAST_HEAD_BYTES)
    )


def _repeated_text(values: Sequence[bytes], counts: Sequence[int]) -> pa.Array:
    """A string column holding ``values[i]`` ``counts[i]`` times, built from buffers."""
    lengths = np.repeat(np.array([len(value) for value in values], np.int64), counts)
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(value * count for value, count in zip(values, counts, strict=True))
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(data))


def _binary(lengths: npt.NDArray[np.int64], data: bytes) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.BinaryArray.from_buffers(
        pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _timestamps(nanoseconds: npt.NDArray[np.int64]) -> pa.Array:
    """Microsecond timestamps (Spark's precision); 0, Broky's "unset", is null."""
    return pa.array(nanoseconds // 1000, _TIMESTAMP, mask=nanoseconds == 0)


def slice_run(run: Run, start: int, stop: int) -> Run:
    """The messages of ``run`` with offsets in ``[start, stop)`` (views, no copy)."""
    first = max(start - run.base_offset, 0)
    last = min(stop - run.base_offset, run.count)
    if first == 0 and last == run.count:
        return run
    sizes = u32_array(memoryview(run.sizes))
    position = sum(sizes[:first])
    end = position + sum(sizes[first:last])
    return Run(
        run.key,
        run.ts_broker,
        max(last - first, 0),
        memoryview(run.sizes)[4 * first : 4 * max(last, first)],
        memoryview(run.messages)[position:end],
        run.partition,
        run.base_offset + first,
    )


def record_batches(
    topic: str,
    partition: int,
    pieces: Iterable[Run | RunColumns],
    time_range: tuple[int, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of ``ARROW_SCHEMA`` for the runs of one partition, in order.

    Each run must carry its ``base_offset``. ``time_range`` keeps only
    messages whose run's ``ts_broker`` is in ``[start, stop)`` (ns): runs
    share one ``ts_broker``, so whole runs are kept or skipped. It applies
    to ``Run`` pieces only: the caller passes ``RunColumns`` only for runs
    it has already selected.
    """
    pending: list[RunColumns] = []
    runs: list[Run] = []
    rows = 0
    size = 0
    topic_bytes = topic.encode()
    for piece in pieces:
        if isinstance(piece, RunColumns):
            if runs:
                pending.append(RunColumns.of_runs(runs))
                runs = []
            pending.append(piece)
            rows += piece.rows
            size += len(piece.messages)
        else:
            if time_range is not None and not time_range[0] <= piece.ts_broker < time_range[1]:
                continue
            if piece.count == 0:
                continue
            runs.append(piece)
            rows += piece.count
            size += len(piece.messages)
        if rows >= BATCH_ROWS or size >= BATCH_BYTES:
            if runs:
                pending.append(RunColumns.of_runs(runs))
            yield _to_batch(topic_bytes, partition, pending)
            pending, runs, rows, size = [], [], 0, 0
    if runs:
        pending.append(RunColumns.of_runs(runs))
    if pending:
        yield _to_batch(topic_bytes, partition, pending)
