"""Record batches: how runs are laid out on disk (``docs/storage.md``).

A batch is what one ``write()`` of a log appends and what one CRC32C
covers. Format version 2 (written today) holds *many runs*: everything a
partition's owner appended in one group-commit round, behind a 48-byte
header and a run table (per run: ``ts_broker``, message count, key length),
then the keys, the wire size table of every message and the message
FlatBuffers exactly as they arrived. Version 1 (written by older brokers,
still read) held one run per batch. Offsets are dense: message *i* of a
batch has offset ``base_offset + i``, so they are implied, never stored.

Why many runs per batch: real traffic changes key almost every message
(device ids, order ids), so a run is often one message long. Per-run
batches cost a header, a CRC call, an index entry and a Python round of
encoding per message; one batch per round costs that once per round, and a
reader (the Spark connector) decodes a batch's columns in one vectorised
pass instead of one Python step per run.

Why one CRC per batch and not per message: a batch is written with one
``write()`` and acknowledged as a whole, so a torn or damaged batch is
dropped as a whole; CRC32C in hardware costs ~4 us per 100 KiB, where a
checksum per 100-byte message would cost more in call overhead than the
write itself.

Version 2 layout (little-endian like FlatBuffers; every part padded to 8 so
that the messages are 8-aligned in the file, as the wire's alignment rules
want)::

    0  u32  batch_length  whole batch in bytes, padding included, multiple of 8
    4  u32  crc32c        CRC32C (Castagnoli) of bytes [8, batch_length)
    8  4s   magic         b"BKB" + format version 2
   12  u16  flags         0; reserved (compression, per-run columns to come)
   14  u16  reserved      0
   16  u32  count         messages in the batch, >= 1
   20  u32  messages_length   sum of the sizes
   24  i64  base_offset   offset of the first message
   32  u32  run_count     runs in the batch, >= 1
   36  u32  keys_length   sum of the key lengths
   40  i64  log_time      ns since the epoch when the log appended it
   48  run table, as three columns: i64 ts_broker x run_count, u32 count x
       run_count, u32 key_length x run_count (16 bytes per run in all);
       keys back to back, padded to 8; sizes (u32 each), padded to 8;
       messages, padded to 8

Version 1 had ``key_length`` (u16) at 14 and ``ts_broker`` (i64) at 32 and
no run table: the key followed the header.

Version 3 is version 2 with two more run table columns after the three:
u64 producer_id x run_count and u64 sequence x run_count (32 bytes per run
in all): the idempotent producer of each run (0: none) and the sequence of
its first message. It is written for batches holding at least one run of an
idempotent producer (others stay version 2), so that a partition's owner
rebuilds its deduplication window from the log after a restart
(``BatchHeader.producer_runs``, a header-only read) and a retry is answered
with the original offsets instead of being stored again.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Final

import attrs
from crc32c import crc32c

from broky.protocol.codec import PADDING, sum_u32, u32_array
from broky.protocol.frames import Buffer, Run
from broky.storage.errors import CorruptRecordError, StorageError

#: Bytes 8..11 of a batch: "BKB" and the format version (1: one run, 2: many
#: runs). A reader that meets another version stops rather than guess.
BATCH_MAGIC: Final = b"BKB\x01"
BATCH_MAGIC_V2: Final = b"BKB\x02"
BATCH_MAGIC_V3: Final = b"BKB\x03"
_PREFIX: Final = struct.Struct("<II")
_V1_TAIL: Final = struct.Struct("<4sHHIIqqq")
_V2_TAIL: Final = struct.Struct("<4sHHIIqIIq")
#: The fixed header of either version; the CRC covers everything from byte 8 on.
BATCH_HEADER: Final = struct.Struct("<II4sHHIIqqq")
_V2_HEADER: Final = struct.Struct("<II4sHHIIqIIq")
BATCH_HEADER_BYTES: Final = BATCH_HEADER.size
_CRC_FROM: Final = _PREFIX.size
#: Bytes of the run table per run (ts_broker, count, key_length).
RUN_ENTRY_BYTES: Final = 16
#: Bytes of a version 3 run table per run (plus producer_id and sequence).
RUN_ENTRY_BYTES_V3: Final = 32
#: What a read's byte budget counts for a run of a version 2 batch besides
#: its key, sizes and messages. At least its table entry on disk, and at
#: least what its durable chunk adds on the wire (a 64-byte head, three
#: vector lengths, the key's NUL and paddings: at most 94 bytes), so that the
#: runs a budget admits also fit a Fetched or Deliver frame of that size,
#: however small the messages.
RUN_BUDGET_OVERHEAD: Final = 96
#: Largest key a batch can carry (the u16 of version 1); wire keys stop at 1,024.
MAX_BATCH_KEY_BYTES: Final = 0xFFFF
#: Largest batch accepted on append and believed on read. A run comes from one
#: frame (4 MiB by default), so 64 MiB leaves room for raised frame limits
#: while a garbage length field can never make a reader allocate gigabytes.
MAX_BATCH_BYTES: Final = 64 * 1024 * 1024


def _pad8(length: int) -> int:
    return -length & 7


@attrs.frozen(slots=True)
class StoredBatch:
    """One run read back from a log, with its offsets: the unit of reads.

    A version 1 batch is one run; a version 2 batch gives one of these per
    run it holds. ``sizes`` and ``messages`` are views of the bytes read;
    ``run`` turns it into the protocol's ``Run`` without copying, ready for
    ``encode_run_chunk`` on the replay path.
    """

    base_offset: int
    count: int
    key: bytes
    ts_broker: int
    log_time: int
    sizes: memoryview
    messages: memoryview
    #: Bytes this run counts for in read budgets: a version 1 batch's whole
    #: length, or a version 2 run's key, sizes and messages plus
    #: ``RUN_BUDGET_OVERHEAD`` (its table entry, and room for its wire chunk).
    #: A slice keeps its run's.
    stored_bytes: int
    #: The idempotent producer that published the run (0: none; a version 3
    #: batch's column) and the sequence of the run's first message here:
    #: what a follower stores with the run so that its deduplication window,
    #: rebuilt when it takes the lead, recognises the producer's retries.
    producer: int = 0
    sequence: int = 0

    @property
    def next_offset(self) -> int:
        """The offset after this batch's last message."""
        return self.base_offset + self.count

    @property
    def last_offset(self) -> int:
        """The offset of this batch's last message."""
        return self.base_offset + self.count - 1

    @property
    def run(self) -> Run:
        """The batch as a protocol ``Run`` (views, no copy)."""
        return Run(self.key, self.ts_broker, self.count, self.sizes, self.messages)

    def message_sizes(self) -> list[int]:
        """Each message's size in bytes, in order."""
        return list(u32_array(self.sizes))

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """``(offset, message bytes)`` for each message, in order."""
        position = 0
        for index, size in enumerate(u32_array(self.sizes)):
            yield self.base_offset + index, self.messages[position : position + size]
            position += size

    def slice(self, start: int, stop: int) -> StoredBatch:
        """The messages with offsets in ``[start, stop)``, as a batch of views.

        Used to begin a read mid-run (an exact replay position) or to stop
        at an upper bound; costs a sum over the size table, no copy.
        """
        start = max(start, self.base_offset)
        stop = min(stop, self.next_offset)
        if start == self.base_offset and stop == self.next_offset:
            return self
        first = start - self.base_offset
        last = stop - self.base_offset
        byte_start = sum_u32(self.sizes[: 4 * first])
        byte_stop = byte_start + sum_u32(self.sizes[4 * first : 4 * last])
        return StoredBatch(
            start,
            stop - start,
            self.key,
            self.ts_broker,
            self.log_time,
            self.sizes[4 * first : 4 * last],
            self.messages[byte_start:byte_stop],
            self.stored_bytes,
            self.producer,
            self.sequence + first if self.producer else 0,
        )


def batch_length(key_length: int, count: int, messages_length: int) -> int:
    """On-disk size of a version 1 batch with these contents."""
    return (
        BATCH_HEADER_BYTES
        + key_length
        + _pad8(key_length)
        + 4 * count
        + _pad8(4 * count)
        + messages_length
        + _pad8(messages_length)
    )


def runs_batch_length(
    run_count: int,
    keys_length: int,
    count: int,
    messages_length: int,
    entry_bytes: int = RUN_ENTRY_BYTES,
) -> int:
    """On-disk size of a version 2 batch (version 3 with ``RUN_ENTRY_BYTES_V3``)."""
    return (
        BATCH_HEADER_BYTES
        + entry_bytes * run_count
        + keys_length
        + _pad8(keys_length)
        + 4 * count
        + _pad8(4 * count)
        + messages_length
        + _pad8(messages_length)
    )


def run_stored_bytes(run: Run) -> int:
    """What ``run`` adds to a version 2 batch, padding aside (its
    ``StoredBatch.stored_bytes`` once read back)."""
    return RUN_ENTRY_BYTES + len(run.key) + 4 * run.count + len(run.messages)


def encode_runs(
    base_offset: int,
    log_time: int,
    runs: Sequence[Run],
    ts_brokers: Sequence[int] | None = None,
    producers: Sequence[tuple[int, int]] | None = None,
) -> bytes:
    """Encode ``runs`` as one version 2 batch: one buffer for one ``write()``.

    ``ts_brokers`` replaces the runs' own ``ts_broker`` (the broker stamps
    durable runs), one per run. ``producers``, when given, is each run's
    ``(producer id, sequence of its first message)`` ((0, 0): none), and
    makes the batch version 3. The sizes and messages are copied verbatim.
    Costs a few list passes per run; every check is done over all runs at
    once. Raises StorageError, with nothing encoded, for runs the format
    cannot hold (the caller's bug: empty runs, oversize keys or batches, a
    size table that disagrees with its messages).
    """
    if not runs:
        raise StorageError("a batch needs at least one run")
    counts = [run.count for run in runs]
    keys = [run.key for run in runs]
    key_lengths = list(map(len, keys))
    size_tables = [run.sizes for run in runs]
    messages = [run.messages for run in runs]
    if ts_brokers is None:
        ts_brokers = [run.ts_broker for run in runs]
    if min(counts) < 1 or list(map(len, size_tables)) != [4 * count for count in counts]:
        raise StorageError("cannot store an empty run or one with a bad size table")
    if max(key_lengths) > MAX_BATCH_KEY_BYTES:
        raise StorageError(f"key of {max(key_lengths)} bytes exceeds {MAX_BATCH_KEY_BYTES}")
    sizes = b"".join(size_tables)
    count = len(sizes) // 4
    run_count = len(runs)
    # Each run's sizes must add up to its messages. Long runs: one C sum per
    # run. Short ones: compare the running sums of all sizes at run ends with
    # the running sums of message lengths (no Python step per run).
    if count > 8 * run_count:
        agree = all(
            sum_u32(memoryview(table)) == len(data)
            for table, data in zip(size_tables, messages, strict=True)
        )
    else:
        size_sums = list(accumulate(u32_array(memoryview(sizes))))
        message_ends = list(accumulate(map(len, messages)))
        agree = [size_sums[end - 1] for end in accumulate(counts)] == message_ends
    if not agree:
        raise StorageError("run sizes do not add up to the length of its messages")
    messages_length = sum(map(len, messages))
    keys_length = sum(key_lengths)
    if producers is not None and len(producers) != run_count:
        raise StorageError(f"{len(producers)} producer entries for {run_count} runs")
    entry = RUN_ENTRY_BYTES if producers is None else RUN_ENTRY_BYTES_V3
    length = runs_batch_length(run_count, keys_length, count, messages_length, entry)
    if length > MAX_BATCH_BYTES:
        raise StorageError(f"batch of {length} bytes exceeds {MAX_BATCH_BYTES}")
    table = struct.pack(f"<{run_count}q{2 * run_count}I", *ts_brokers, *counts, *key_lengths)
    if producers is not None:
        ids, sequences = zip(*producers, strict=True)
        table += struct.pack(f"<{2 * run_count}Q", *ids, *sequences)
    body = b"".join(
        (
            _V2_TAIL.pack(
                BATCH_MAGIC_V2 if producers is None else BATCH_MAGIC_V3,
                0,
                0,
                count,
                messages_length,
                base_offset,
                run_count,
                keys_length,
                log_time,
            ),
            table,
            *keys,
            PADDING[_pad8(keys_length)],
            sizes,
            PADDING[_pad8(4 * count)],
            *messages,
            PADDING[_pad8(messages_length)],
        )
    )
    return _PREFIX.pack(length, crc32c(body)) + body


def encode_batch(base_offset: int, log_time: int, run: Run) -> bytes:
    """Encode ``run`` as one version 1 batch, as brokers before format 2 did.

    Logs keep being written in version 2 (:func:`encode_runs`); this stays so
    that tests and tools can write the logs older brokers left behind, which
    must stay readable. Raises StorageError like :func:`encode_runs`.
    """
    key = run.key
    count = run.count
    messages_length = len(run.messages)
    if count < 1 or len(run.sizes) != 4 * count:
        raise StorageError(f"cannot store a run of {count} messages with a bad size table")
    if len(key) > MAX_BATCH_KEY_BYTES:
        raise StorageError(f"key of {len(key)} bytes exceeds {MAX_BATCH_KEY_BYTES}")
    if sum_u32(memoryview(run.sizes)) != messages_length:
        raise StorageError("run sizes do not add up to the length of its messages")
    length = batch_length(len(key), count, messages_length)
    if length > MAX_BATCH_BYTES:
        raise StorageError(f"batch of {length} bytes exceeds {MAX_BATCH_BYTES}")
    tail = _V1_TAIL.pack(
        BATCH_MAGIC, 0, len(key), count, messages_length, base_offset, run.ts_broker, log_time
    )
    parts = (
        tail,
        key,
        PADDING[_pad8(len(key))],
        run.sizes,
        PADDING[_pad8(4 * count)],
        run.messages,
        PADDING[_pad8(messages_length)],
    )
    crc = 0
    for part in parts:
        crc = crc32c(part, crc)
    return b"".join((_PREFIX.pack(length, crc), *parts))


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
    fields = _V2_HEADER.unpack_from(buf, position)
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

    def runs(self, start: int = 0, stop: int | None = None) -> Iterator[StoredBatch]:
        """The runs with messages in ``[start, stop)``, in order, sliced to it.

        Runs before ``start`` cost a little arithmetic each, no object.
        """
        stop = self.next_offset if stop is None else stop
        offset = self.base_offset
        message = key_at = 0
        position = -1  # byte position of message ``message``, once needed
        sizes = u32_array(self.sizes)
        log_time = self.log_time
        one_run = self.version == 1
        producers = self.producers
        for index, (ts_broker, count, key_length) in enumerate(
            zip(self.ts_brokers, self.counts, self.key_lengths, strict=True)
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
    if crc32c(view[position + _CRC_FROM : end]) != header.crc:
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
            identities = struct.unpack_from(f"<{2 * runs}Q", view, keys_at + 16 * runs)
            producers, sequences = identities[:runs], identities[runs:]
        keys_at += header.entry_bytes * runs
    sizes_at = keys_at + header.keys_length + _pad8(header.keys_length)
    messages_at = sizes_at + 4 * header.count + _pad8(4 * header.count)
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
