"""The record batch: how one run is laid out on disk (``docs/storage.md``).

A batch holds one run: the run's key and ``ts_broker``, the wire size table
and the message FlatBuffers exactly as they arrived, behind a 48-byte header
that gives the batch's base offset, message count, append time and a CRC32C.
Message *i* of a batch has offset ``base_offset + i``: offsets are dense, so
they are implied rather than stored per message, and the sizes and messages
stay byte for byte the ``Run.sizes`` and ``Run.messages`` of the wire. Appending
is one ``join``; replaying is a view, never a re-encode.

Why one CRC per batch and not per message: a batch is written with one
``write()`` and acknowledged as a whole, so a torn or damaged batch is dropped
as a whole; one checksum over ~100 KiB costs about 4 us with CRC32C in
hardware, where a checksum per 100-byte message would cost more in Python
call overhead than the write itself.

Layout (little-endian like FlatBuffers; every part padded to 8 so that the
messages are 8-aligned in the file, as the wire's alignment rules want)::

    0  u32  batch_length  whole batch in bytes, padding included, multiple of 8
    4  u32  crc32c        CRC32C (Castagnoli) of bytes [8, batch_length)
    8  4s   magic         b"BKB" + format version 1
   12  u16  flags         0; reserved (compression)
   14  u16  key_length
   16  u32  count         messages in the batch, >= 1
   20  u32  messages_length   sum of the sizes
   24  i64  base_offset   offset of the first message
   32  i64  ts_broker     the run's ts_broker as it arrived (0 = unset)
   40  i64  log_time      ns since the epoch when the log appended it
   48  key, zero-padded to 8; sizes (u32 each), padded to 8;
       messages, padded to 8
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

import attrs
from crc32c import crc32c

from broky.protocol.codec import PADDING, sum_u32, u32_array
from broky.protocol.frames import Buffer, Run
from broky.storage.errors import CorruptRecordError, StorageError

#: Bytes 8..11 of every batch: "BKB" and the format version. A reader that
#: meets another version stops rather than guess.
BATCH_MAGIC: Final = b"BKB\x01"
_PREFIX: Final = struct.Struct("<II")
_HEAD_TAIL: Final = struct.Struct("<4sHHIIqqq")
#: The fixed header; the CRC covers everything from byte 8 on.
BATCH_HEADER: Final = struct.Struct("<II4sHHIIqqq")
BATCH_HEADER_BYTES: Final = BATCH_HEADER.size
_CRC_FROM: Final = _PREFIX.size
#: Largest key a batch can carry (u16 field); wire keys stop at 1,024 bytes.
MAX_BATCH_KEY_BYTES: Final = 0xFFFF
#: Largest batch accepted on append and believed on read. A run comes from one
#: frame (4 MiB by default), so 64 MiB leaves room for raised frame limits
#: while a garbage length field can never make a reader allocate gigabytes.
MAX_BATCH_BYTES: Final = 64 * 1024 * 1024


def _pad8(length: int) -> int:
    return -length & 7


@attrs.frozen(slots=True)
class StoredBatch:
    """A verified batch read back from a log: one run and its offsets.

    ``sizes`` and ``messages`` are views of the bytes read; ``run`` turns the
    batch into the protocol's ``Run`` without copying, ready for
    ``encode_run_chunk`` on the replay path.
    """

    base_offset: int
    count: int
    key: bytes
    ts_broker: int
    log_time: int
    sizes: memoryview
    messages: memoryview
    #: On-disk size of the batch this came from (a slice keeps its batch's).
    stored_bytes: int

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

        Used to begin a read mid-batch (an exact replay position) or to stop
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
        )


def batch_length(key_length: int, count: int, messages_length: int) -> int:
    """On-disk size of a batch with these contents."""
    return (
        BATCH_HEADER_BYTES
        + key_length
        + _pad8(key_length)
        + 4 * count
        + _pad8(4 * count)
        + messages_length
        + _pad8(messages_length)
    )


def encode_batch(base_offset: int, log_time: int, run: Run) -> bytes:
    """Encode ``run`` as one batch: a single buffer for a single ``write()``.

    The run's sizes and messages are copied once, verbatim. Raises
    StorageError for a run the format cannot hold (caller's bug: empty runs,
    oversize keys or batches, a size table that disagrees with the messages).
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
    tail = _HEAD_TAIL.pack(
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
    """The fixed header of a batch, as read from disk (not yet verified)."""

    length: int
    crc: int
    key_length: int
    count: int
    messages_length: int
    base_offset: int
    ts_broker: int
    log_time: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


def read_header(buf: Buffer, position: int) -> BatchHeader | str:
    """Parse and sanity-check the header at ``position``.

    Returns the header, or a short reason why these bytes are not a batch
    header (too short, wrong magic, lengths that disagree). The CRC is not
    checked here: see :func:`verify_batch`.
    """
    if position + BATCH_HEADER_BYTES > len(buf):
        return "truncated header"
    (
        length,
        crc,
        magic,
        flags,
        key_length,
        count,
        messages_length,
        base_offset,
        ts_broker,
        log_time,
    ) = BATCH_HEADER.unpack_from(buf, position)
    if magic != BATCH_MAGIC:
        return f"bad magic {bytes(magic)!r}"
    if flags != 0 or count < 1:
        return "bad flags or empty batch"
    if length > MAX_BATCH_BYTES or length != batch_length(key_length, count, messages_length):
        return f"batch length {length} disagrees with its header"
    return BatchHeader(
        length, crc, key_length, count, messages_length, base_offset, ts_broker, log_time
    )


def verify_batch(buf: Buffer, position: int) -> StoredBatch | str:
    """Check the batch at ``position`` whole (framing and CRC32C) and view it.

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
    key_at = position + BATCH_HEADER_BYTES
    sizes_at = key_at + header.key_length + _pad8(header.key_length)
    messages_at = sizes_at + 4 * header.count + _pad8(4 * header.count)
    sizes = view[sizes_at : sizes_at + 4 * header.count]
    if sum_u32(sizes) != header.messages_length:
        return "sizes do not add up to the messages"
    return StoredBatch(
        header.base_offset,
        header.count,
        bytes(view[key_at : key_at + header.key_length]),
        header.ts_broker,
        header.log_time,
        sizes,
        view[messages_at : messages_at + header.messages_length],
        header.length,
    )


def decode_batch(buf: Buffer, position: int, path: str = "", file_position: int = 0) -> StoredBatch:
    """:func:`verify_batch`, raising CorruptRecordError instead of a reason."""
    batch = verify_batch(buf, position)
    if isinstance(batch, str):
        raise CorruptRecordError(f"corrupt batch: {batch}", path, file_position + position)
    return batch
