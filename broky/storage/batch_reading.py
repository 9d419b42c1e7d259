"""Reading record batches: the header, the whole-batch check, the columns.

The layout is documented with the writer, in broky.storage.batch; this is
the side that believes nothing it reads: a header is sanity-checked before
its lengths are used, a batch is CRC-checked whole before it is viewed, and
a failure is a short reason (or CorruptRecordError), never a stray
exception from struct.
"""

from __future__ import annotations

import struct
import sys
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, islice

import attrs
from crc32c import crc32c

from broky.compiled import compiled_twin
from broky.protocol.codec import sum_u32, u32_array
from broky.protocol.frames import Buffer
from broky.storage.batch import (
    BATCH_HEADER,
    BATCH_HEADER_BYTES,
    BATCH_MAGIC,
    BATCH_MAGIC_V2,
    BATCH_MAGIC_V3,
    CRC_FROM,
    MAX_BATCH_BYTES,
    RUN_BUDGET_OVERHEAD,
    RUN_ENTRY_BYTES,
    RUN_ENTRY_BYTES_V3,
    V2_HEADER,
    StoredBatch,
    batch_length,
    pad8,
    runs_batch_length,
)
from broky.storage.errors import CorruptRecordError

#: The batch format is little-endian; a native cast reads it only then.
_LITTLE_ENDIAN = sys.byteorder == "little"


@attrs.frozen(slots=True)
class BatchHeader:
    """The fixed header of a batch of either version, as read from disk
    (not yet verified). A version 1 batch reads as one run whose key follows
    the header and whose ``ts_broker`` is the header's."""

    length: int
    crc: int
    version: int
    count: int
    messages_length: int
    base_offset: int
    log_time: int
    run_count: int
    keys_length: int
    #: Version 1 only (version 2 keeps one per run in its run table).
    ts_broker: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count

    @property
    def entry_bytes(self) -> int:
        """Bytes of the run table per run (0: version 1, which has none)."""
        return (0, 0, RUN_ENTRY_BYTES, RUN_ENTRY_BYTES_V3)[self.version]

    @property
    def table_bytes(self) -> int:
        """Bytes after the header that say which keys the batch holds: the
        run table and the keys (versions 2 and 3), or the key (version 1)."""
        return self.entry_bytes * self.run_count + self.keys_length

    def producer_runs(self, table: Buffer) -> list[tuple[int, int, int, int]]:
        """``(producer id, first sequence, message count, first offset)`` of
        each run of an idempotent producer, from the ``table_bytes`` after
        the header (empty before version 3): what rebuilds an owner's
        deduplication window without reading messages."""
        if self.version < 3:
            return []
        runs = self.run_count
        counts = struct.unpack_from(f"<{runs}I", table, 8 * runs)
        columns = struct.unpack_from(f"<{2 * runs}Q", table, 16 * runs)
        found = []
        offset = self.base_offset
        for producer, sequence, count in zip(columns[:runs], columns[runs:], counts, strict=True):
            if producer:
                found.append((producer, sequence, count, offset))
            offset += count
        return found

    def key_last_offsets(self, table: Buffer) -> list[tuple[bytes, int]]:
        """``(key, offset of its last message)`` per run, from the
        ``table_bytes`` after the header: a lookup that reads no messages."""
        if self.version == 1:
            return [(bytes(table[: self.keys_length]), self.next_offset - 1)]
        runs = self.run_count
        columns = struct.unpack_from(f"<{2 * runs}I", table, 8 * runs)
        found = []
        key_at = self.entry_bytes * runs
        for key_length, end in zip(columns[runs:], accumulate(columns[:runs]), strict=True):
            found.append((bytes(table[key_at : key_at + key_length]), self.base_offset + end - 1))
            key_at += key_length
        return found


def read_header(buf: Buffer, position: int) -> BatchHeader | str:
    """Parse and sanity-check the header at ``position``.

    Returns the header, or a short reason why these bytes are not a batch
    header (too short, unknown magic, lengths that disagree). The CRC is not
    checked here: see :func:`verify_batch`.
    """
    if position + BATCH_HEADER_BYTES > len(buf):
        return "truncated header"
    fields = V2_HEADER.unpack_from(buf, position)
    length, crc, magic, flags, reserved, count, messages_length, base_offset = fields[:8]
    word, tail, log_time = fields[8:]
    if magic in (BATCH_MAGIC_V2, BATCH_MAGIC_V3):
        runs, keys_length = word, tail
        if flags != 0 or reserved != 0 or count < 1 or runs < 1:
            return "bad flags or empty batch"
        version = magic[3]
        entry = RUN_ENTRY_BYTES if version == 2 else RUN_ENTRY_BYTES_V3
        expected = runs_batch_length(runs, keys_length, count, messages_length, entry)
        header = BatchHeader(
            length,
            crc,
            version,
            count,
            messages_length,
            base_offset,
            log_time,
            runs,
            keys_length,
            0,
        )
    elif magic == BATCH_MAGIC:
        if flags != 0 or count < 1:
            return "bad flags or empty batch"
        key_length = reserved
        ts_broker = BATCH_HEADER.unpack_from(buf, position)[8]
        expected = batch_length(key_length, count, messages_length)
        header = BatchHeader(
            length, crc, 1, count, messages_length, base_offset, log_time, 1, key_length, ts_broker
        )
    else:
        return f"bad magic {bytes(magic)!r}"
    if length > MAX_BATCH_BYTES or length != expected:
        return f"batch length {length} disagrees with its header"
    return header


def distinct_keys_pure(
    counts: Sequence[int],
    key_lengths: Sequence[int],
    keys: Buffer,
    base_offset: int,
    start: int,
    stop: int,
) -> set[bytes]:
    """The distinct keys of the runs (``counts`` messages each, the first at
    ``base_offset``, their keys ``key_lengths`` long back to back in
    ``keys``) with messages in ``[start, stop)``. The compiled twin
    (``broky.protocol._columns.distinct_keys``) makes a ``bytes`` only per
    key it has not met, not per run."""
    view = memoryview(keys)
    found: set[bytes] = set()
    offset = base_offset
    key_at = 0
    for count, key_length in zip(counts, key_lengths, strict=True):
        if offset >= stop:
            break
        offset += count
        if offset > start:
            found.add(bytes(view[key_at : key_at + key_length]))
        key_at += key_length
    return found


#: :func:`distinct_keys_pure` compiled, when it is built.
distinct_keys_compiled = compiled_twin("broky.protocol._columns", "distinct_keys")
distinct_keys = distinct_keys_pure
if distinct_keys_compiled is not None:
    distinct_keys = distinct_keys_compiled


@attrs.frozen(slots=True)
class RecordBatch:
    """A verified batch of either version, as columns over the bytes read.

    ``ts_brokers``, ``counts`` and ``key_lengths`` have one entry per run;
    ``keys`` is the runs' keys back to back; ``sizes`` and ``messages`` are
    those of every message of the batch, in offset order. Columnar readers
    (the Spark connector) use these directly; :meth:`runs` gives one
    :class:`StoredBatch` per run.
    """

    base_offset: int
    count: int
    log_time: int
    stored_bytes: int
    version: int
    ts_brokers: Sequence[int]
    counts: Sequence[int]
    key_lengths: Sequence[int]
    keys: memoryview
    sizes: memoryview
    messages: memoryview
    #: Version 3: each run's producer id and first sequence (empty before).
    producers: Sequence[int] = ()
    sequences: Sequence[int] = ()

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count

    def keys_between(self, start: int, stop: int) -> set[bytes]:
        """The distinct keys of the runs with messages in ``[start, stop)``:
        what a shared subscription's filter checks before it takes a whole
        span as one range (keys repeat across a batch's runs)."""
        return distinct_keys(
            self.counts, self.key_lengths, self.keys, self.base_offset, start, stop
        )

    def runs(self, start: int = 0, stop: int | None = None) -> Iterator[StoredBatch]:
        """The runs with messages in ``[start, stop)``, in order, sliced to it.

        Runs before ``start`` are skipped with a few C-speed passes over the
        run table (a consumer's reads often begin deep inside a batch of
        hundreds of one-message runs), no object and no Python step each.
        """
        stop = self.next_offset if stop is None else stop
        first_run = message = key_at = 0
        if start > self.base_offset and len(self.counts) > 1:
            ends = list(accumulate(self.counts))
            first_run = bisect_right(ends, start - self.base_offset)
            message = ends[first_run - 1] if first_run else 0
            key_at = sum(self.key_lengths[:first_run])
        offset = self.base_offset + message
        position = -1  # byte position of message ``message``, once needed
        sizes = u32_array(self.sizes)
        log_time = self.log_time
        one_run = self.version == 1
        producers = self.producers
        columns = zip(self.ts_brokers, self.counts, self.key_lengths, strict=True)
        for index, (ts_broker, count, key_length) in enumerate(
            islice(columns, first_run, None), first_run
        ):
            end = offset + count
            if offset >= stop:
                return
            if end > start:
                if position < 0:
                    position = sum(sizes[:message])
                length = sizes[message] if count == 1 else sum(sizes[message : message + count])
                run = StoredBatch(
                    offset,
                    count,
                    bytes(self.keys[key_at : key_at + key_length]),
                    ts_broker,
                    log_time,
                    self.sizes[4 * message : 4 * (message + count)],
                    self.messages[position : position + length],
                    self.stored_bytes
                    if one_run
                    else RUN_BUDGET_OVERHEAD + key_length + 4 * count + length,
                    producers[index] if producers else 0,
                    self.sequences[index] if producers and producers[index] else 0,
                )
                yield run if start <= offset and end <= stop else run.slice(start, stop)
                position += length
            offset = end
            message += count
            key_at += key_length


@attrs.frozen(slots=True)
class BatchSpan:
    """Offsets ``[start, stop)`` of one verified record batch: the unit a
    durable subscription reads, caches and delivers from.

    One of these per stored batch, not per run: with keys changing on every
    message a batch holds hundreds of one-message runs, and a
    :class:`StoredBatch` for each was most of a subscription read's cost.
    The runs are laid out only when delivered (``delivery.located_chunks``)
    or when an ordered subscription needs each one's key (:meth:`runs`).
    """

    batch: RecordBatch
    start: int
    stop: int

    @property
    def base_offset(self) -> int:
        return self.start

    @property
    def next_offset(self) -> int:
        return self.stop

    def runs(self, start: int = 0, stop: int | None = None) -> Iterator[StoredBatch]:
        """The span's runs with messages in ``[start, stop)``, sliced to both."""
        upper = self.stop if stop is None else min(stop, self.stop)
        return self.batch.runs(max(start, self.start), upper)


def _u64s(view: memoryview, at: int, count: int) -> Sequence[int]:
    """``count`` little-endian uint64 from ``at``, read only as they are
    indexed (a cast view: no int object per entry until one is read; a
    consumer's reads never look at a run's producer and sequence, which
    were two objects per run, a message each over many keys); unpacked on
    a big-endian host."""
    if _LITTLE_ENDIAN:
        return view[at : at + 8 * count].cast("Q")
    return struct.unpack_from(f"<{count}Q", view, at)


def verify_batch(buf: Buffer, position: int) -> RecordBatch | str:
    """Check the batch at ``position`` whole (framing, CRC32C, run table) and view it.

    Returns the batch, or the reason it is not a valid batch. ``buf`` must
    hold the whole batch for it to verify.
    """
    header = read_header(buf, position)
    if isinstance(header, str):
        return header
    end = position + header.length
    if end > len(buf):
        return "truncated batch"
    view = memoryview(buf)
    if crc32c(view[position + CRC_FROM : end]) != header.crc:
        return "CRC32C mismatch"
    keys_at = position + BATCH_HEADER_BYTES
    runs = header.run_count
    producers: Sequence[int] = ()
    sequences: Sequence[int] = ()
    if header.version == 1:
        ts_brokers: Sequence[int] = (header.ts_broker,)
        counts: Sequence[int] = (header.count,)
        key_lengths: Sequence[int] = (header.keys_length,)
    else:
        columns = struct.unpack_from(f"<{runs}q{2 * runs}I", view, keys_at)
        ts_brokers, counts, key_lengths = columns[:runs], columns[runs:-runs], columns[-runs:]
        if min(counts) < 1 or sum(counts) != header.count:
            return "run counts disagree with the message count"
        if header.version == 3:
            at = keys_at + 16 * runs
            producers, sequences = _u64s(view, at, runs), _u64s(view, at + 8 * runs, runs)
        keys_at += header.entry_bytes * runs
    sizes_at = keys_at + header.keys_length + pad8(header.keys_length)
    messages_at = sizes_at + 4 * header.count + pad8(4 * header.count)
    sizes = view[sizes_at : sizes_at + 4 * header.count]
    if sum_u32(sizes) != header.messages_length or sum(key_lengths) != header.keys_length:
        return "sizes or key lengths do not add up to the messages or keys"
    return RecordBatch(
        header.base_offset,
        header.count,
        header.log_time,
        header.length,
        header.version,
        ts_brokers,
        counts,
        key_lengths,
        view[keys_at : keys_at + header.keys_length],
        sizes,
        view[messages_at : messages_at + header.messages_length],
        producers,
        sequences,
    )


def decode_batch(buf: Buffer, position: int, path: str = "", file_position: int = 0) -> RecordBatch:
    """:func:`verify_batch`, raising CorruptRecordError instead of a reason."""
    batch = verify_batch(buf, position)
    if isinstance(batch, str):
        raise CorruptRecordError(f"corrupt batch: {batch}", path, file_position + position)
    return batch
