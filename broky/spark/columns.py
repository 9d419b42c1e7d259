"""The connector's row layout and a columnar decoder from stored runs to Arrow.

Spark's Python data sources hand rows to the JVM as Arrow; building Arrow
columns straight from a run's bytes is what makes a batch read fast (a
Python object per message would cap it near 300k rows/s per core). Messages
in the layout ``encode_message`` writes when only payload and
``ts_producer`` are set (the common case) are decoded with numpy, a run at a
time; any other layout (key_partition, uid or tags present, or another
FlatBuffers writer) goes through ``decode_message`` one message at a time.

The Arrow schema is derived from the Spark schema, nullability included,
because Spark rejects batches whose schema differs in any way.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

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
from broky.protocol.message import decode_message, message_views

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

#: Rows per Arrow batch handed to Spark: large enough that per-batch costs
#: (IPC framing, JVM conversion) vanish, small enough to bound a task's
#: memory to a few MiB of 100-byte messages.
BATCH_ROWS: Final = 65_536

# The fixed layout of encode_message's fast path: bytes [0, 24) and [32, 48)
# are constant (root offset, vtable, soffset, field offsets with
# key_partition, uid and tags absent); ts_producer is at 24, the payload's
# length at 48 and its bytes from 52.
_FAST_HEAD: Final = np.frombuffer(
    struct.pack("<I7H2xiqIIIII", 20, 14, 28, 0, 12, 4, 0, 0, 16, 0, 16, 0, 0, 0, 0), np.uint8
)
_FAST_CONSTANT: Final = np.r_[0:24, 32:48]
_FAST_HEAD_BYTES: Final = 52


class _Columns:
    """Column pieces of consecutive messages of one partition, in offset order."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic.encode()
        self.partition = partition
        self.rows = 0
        self.keys: list[bytes] = []
        self.key_counts: list[int] = []
        self.ts_broker: list[int] = []
        self.offsets: list[npt.NDArray[np.int64]] = []
        self.ts_producer: list[npt.NDArray[np.int64]] = []
        self.payload_lengths: list[npt.NDArray[np.int64]] = []
        self.payloads: list[bytes] = []
        #: Rows that carry key_partition, uid or tags, by row number: rare,
        #: so they are kept sparse and the columns are null/empty otherwise.
        self.extras: dict[int, tuple[bytes, bytes, list[tuple[str, str]]]] = {}

    def add_plain(
        self,
        run: Run,
        offsets: npt.NDArray[np.int64],
        ts_producer: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        payloads: bytes,
    ) -> None:
        """Messages of the fast layout, already split into columns."""
        self._add_run(run, len(offsets))
        self.offsets.append(offsets)
        self.ts_producer.append(ts_producer)
        self.payload_lengths.append(lengths)
        self.payloads.append(payloads)

    def add_decoded(self, run: Run) -> None:
        """A run through the general decoder, one message at a time."""
        first_row = self.rows
        key = bytes(run.key).decode(errors="replace")
        messages = [decode_message(view, key, run.ts_broker) for view in message_views(run)]
        self._add_run(run, len(messages))
        self.offsets.append(np.arange(run.base_offset, run.base_offset + run.count))
        self.ts_producer.append(np.array([m.ts_producer for m in messages], np.int64))
        self.payload_lengths.append(np.array([len(m.payload) for m in messages], np.int64))
        self.payloads.append(b"".join(m.payload for m in messages))
        for row, message in enumerate(messages, first_row):
            if message.key_partition or message.uid or message.tags:
                self.extras[row] = (message.key_partition, message.uid, list(message.tags))

    def _add_run(self, run: Run, count: int) -> None:
        self.keys.append(bytes(run.key))
        self.key_counts.append(count)
        self.ts_broker.append(run.ts_broker)
        self.rows += count

    def to_batch(self) -> pa.RecordBatch:
        """The rows gathered so far as one Arrow batch of ``ARROW_SCHEMA``."""
        rows = self.rows
        counts = np.array(self.key_counts, np.int64)
        key_partition: pa.Array = pa.nulls(rows, pa.binary())
        uid: pa.Array = pa.nulls(rows, pa.binary())
        tags: pa.Array = pa.MapArray.from_arrays(
            np.zeros(rows + 1, np.int32),
            pa.array([], pa.string()),
            pa.array([], pa.string()),
            type=_TAGS,
        )
        if self.extras:
            key_partitions: list[bytes | None] = [None] * rows
            uids: list[bytes | None] = [None] * rows
            tag_lists: list[list[tuple[str, str]]] = [[] for _ in range(rows)]
            for row, (row_key_partition, row_uid, row_tags) in self.extras.items():
                key_partitions[row] = row_key_partition or None
                uids[row] = row_uid or None
                tag_lists[row] = row_tags
            key_partition = pa.array(key_partitions, pa.binary())
            uid = pa.array(uids, pa.binary())
            tags = pa.array(tag_lists, _TAGS)
        columns = [
            _repeated_text([self.topic], [rows]),
            pa.array(np.full(rows, self.partition, np.int32)),
            pa.array(np.concatenate(self.offsets)),
            _repeated_text(self.keys, self.key_counts),
            key_partition,
            _binary(np.concatenate(self.payload_lengths), b"".join(self.payloads)),
            _timestamps(np.concatenate(self.ts_producer)),
            _timestamps(np.repeat(np.array(self.ts_broker, np.int64), counts)),
            uid,
            tags,
        ]
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


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


def _split_plain(run: Run) -> tuple[npt.NDArray[np.int64], ...] | None:
    """``(ts_producer, payload lengths, payload byte positions)`` of a run whose
    messages all have the fast layout, or None if any has not."""
    sizes = np.frombuffer(run.sizes, "<u4").astype(np.int64)
    if len(sizes) == 0 or sizes.min() < _FAST_HEAD_BYTES:
        return None
    messages = np.frombuffer(run.messages, np.uint8)
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    heads = messages[starts[:, None] + np.arange(_FAST_HEAD_BYTES)]
    if not (heads[:, _FAST_CONSTANT] == _FAST_HEAD[_FAST_CONSTANT]).all():
        return None
    ts_producer = heads[:, 24:32].copy().view("<i8").ravel().astype(np.int64)
    lengths = heads[:, 48:52].copy().view("<u4").ravel().astype(np.int64)
    if (lengths + _FAST_HEAD_BYTES > sizes).any():
        return None
    payload_ends = np.cumsum(lengths)
    positions = np.repeat(starts + _FAST_HEAD_BYTES - (payload_ends - lengths), lengths)
    positions += np.arange(int(payload_ends[-1]), dtype=np.int64)
    return ts_producer, lengths, positions


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
    runs: Iterable[Run],
    time_range: tuple[int, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of ``ARROW_SCHEMA`` for the runs of one partition, in order.

    Each run must carry its ``base_offset``. ``time_range`` keeps only
    messages whose run's ``ts_broker`` is in ``[start, stop)`` (ns): runs
    share one ``ts_broker``, so whole runs are kept or skipped.
    """
    columns = _Columns(topic, partition)
    for run in runs:
        if time_range is not None and not time_range[0] <= run.ts_broker < time_range[1]:
            continue
        plain = _split_plain(run)
        if plain is None:
            columns.add_decoded(run)
        else:
            ts_producer, lengths, positions = plain
            payloads = np.frombuffer(run.messages, np.uint8)[positions].tobytes()
            offsets = np.arange(run.base_offset, run.base_offset + run.count, dtype=np.int64)
            columns.add_plain(run, offsets, ts_producer, lengths, payloads)
        if columns.rows >= BATCH_ROWS:
            yield columns.to_batch()
            columns = _Columns(topic, partition)
    if columns.rows:
        yield columns.to_batch()
