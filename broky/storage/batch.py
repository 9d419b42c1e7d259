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
(``batch_reading.BatchHeader.producer_runs``, a header-only read) and a retry is answered
with the original offsets instead of being stored again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import Final, Protocol

import attrs
from crc32c import crc32c

from broky.compiled import compiled_twin
from broky.protocol.codec import PADDING, sum_u32, u32_array
from broky.protocol.frames import Run
from broky.storage.errors import StorageError

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
V2_HEADER: Final = struct.Struct("<II4sHHIIqIIq")
BATCH_HEADER_BYTES: Final = BATCH_HEADER.size
CRC_FROM: Final = _PREFIX.size
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


def pad8(length: int) -> int:
    """Bytes of padding that bring ``length`` to a multiple of 8."""
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
        + pad8(key_length)
        + 4 * count
        + pad8(4 * count)
        + messages_length
        + pad8(messages_length)
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
        + pad8(keys_length)
        + 4 * count
        + pad8(4 * count)
        + messages_length
        + pad8(messages_length)
    )


def run_stored_bytes(run: Run) -> int:
    """What ``run`` adds to a version 2 batch, padding aside (its
    ``StoredBatch.stored_bytes`` once read back)."""
    return RUN_ENTRY_BYTES + len(run.key) + 4 * run.count + len(run.messages)


def stored_byte_ends_pure(runs: Sequence[Run]) -> list[int]:
    """The running total of ``run_stored_bytes`` over ``runs``: where a log
    cuts a round into batches (``broky.storage.batch_bounds``)."""
    return list(accumulate(map(run_stored_bytes, runs)))


def encode_runs_pure(
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
    if ts_brokers is not None and len(ts_brokers) != len(runs):
        raise StorageError(f"{len(ts_brokers)} ts_broker stamps for {len(runs)} runs")
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
            PADDING[pad8(keys_length)],
            sizes,
            PADDING[pad8(4 * count)],
            *messages,
            PADDING[pad8(messages_length)],
        )
    )
    return _PREFIX.pack(length, crc32c(body)) + body


#: The compiled twins (``broky.storage._batch``) where they are built; the
#: pure versions otherwise. Hypothesis tests hold them byte-equal.
class EncodeRuns(Protocol):
    """``encode_runs_pure``'s signature, which its compiled twin shares."""

    def __call__(
        self,
        base_offset: int,
        log_time: int,
        runs: Sequence[Run],
        ts_brokers: Sequence[int] | None = None,
        producers: Sequence[tuple[int, int]] | None = None,
    ) -> bytes: ...


encode_runs_compiled: EncodeRuns | None = compiled_twin("broky.storage._batch", "encode_runs")
encode_runs: EncodeRuns = encode_runs_compiled or encode_runs_pure
StoredByteEnds = Callable[[Sequence[Run]], list[int]]
stored_byte_ends_compiled: StoredByteEnds | None = compiled_twin(
    "broky.storage._batch", "stored_byte_ends"
)
stored_byte_ends: StoredByteEnds = stored_byte_ends_compiled or stored_byte_ends_pure


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
        PADDING[pad8(len(key))],
        run.sizes,
        PADDING[pad8(4 * count)],
        run.messages,
        PADDING[pad8(messages_length)],
    )
    crc = 0
    for part in parts:
        crc = crc32c(part, crc)
    return b"".join((_PREFIX.pack(length, crc), *parts))
