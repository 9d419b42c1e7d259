"""Sequential reads of a segment's ``.log``: the read window, the CRC scan
that recovery runs on open, and the header walk of lookups.

Why its own module: these read a file descriptor and know the batch layout,
nothing of a ``Segment``'s state (its index, its size, its handles); a
segment and the standalone log reader (``broky.storage.reader``) both use
them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Final

import attrs

from broky.storage.batch import BATCH_HEADER_BYTES
from broky.storage.batch_reading import BatchHeader, RecordBatch, read_header, verify_batch
from broky.storage.index import SegmentIndex

#: Bytes read per ``pread`` when scanning or reading sequentially: large
#: enough that syscalls cost little next to CRC and parsing, small enough to
#: stay in L2 cache while it is checked.
READ_WINDOW_BYTES: Final = 1024 * 1024


class ReadWindow:
    """Sequential reads of a file through a buffer refilled with ``pread``.

    ``get(position, length)`` returns a buffer and the index where the byte at
    ``position`` sits in it, refilling so that ``length`` bytes follow.
    """

    def __init__(self, fd: int, end: int, window: int = READ_WINDOW_BYTES) -> None:
        self.fd = fd
        self.end = end
        self.window = window
        self.buffer = b""
        self.start = 0

    def get(self, position: int, length: int) -> tuple[bytes, int] | None:
        """``None`` when ``[position, position + length)`` passes the end."""
        if position + length > self.end:
            return None
        at = position - self.start
        if at < 0 or at + length > len(self.buffer):
            size = min(max(length, self.window), self.end - position)
            self.buffer = os.pread(self.fd, size, position)
            self.start = position
            at = 0
            if len(self.buffer) < length:
                return None
        return self.buffer, at


@attrs.frozen(slots=True)
class ScanResult:
    """What a CRC scan of a ``.log`` found."""

    valid_bytes: int
    next_offset: int
    batches: int
    last_log_time: int
    error: str | None


def verified_batches(fd: int, size: int) -> Iterator[tuple[int, RecordBatch | str]]:
    """``(position, batch)`` for each valid batch from the start of a ``.log``.

    Stops at the first invalid one, after yielding ``(position, reason)``
    for it. Offset continuity is the caller's to check.
    """
    window = ReadWindow(fd, size)
    position = 0
    while position < size:
        got = window.get(position, BATCH_HEADER_BYTES)
        header = read_header(*got) if got is not None else "truncated header"
        if isinstance(header, str):
            yield position, header
            return
        got = window.get(position, header.length)
        batch = verify_batch(*got) if got is not None else "truncated batch"
        yield position, batch
        if isinstance(batch, str):
            return
        position += header.length


def scan(fd: int, base_offset: int, size: int, index: SegmentIndex) -> ScanResult:
    """Verify every batch from the start; fill ``index``; stop at the first bad one.

    A batch is good when its framing and CRC32C hold and its base offset
    continues the previous one (offsets are dense). Everything from the first
    bad batch on is reported as invalid, whatever follows it: a torn write
    leaves garbage after it, and bytes after garbage cannot be trusted to be
    batch-aligned.
    """
    valid_bytes = 0
    next_offset = base_offset
    batches = 0
    last_log_time = 0
    error: str | None = None
    for position, batch in verified_batches(fd, size):
        if isinstance(batch, str):
            error = batch
            break
        if batch.base_offset != next_offset:
            error = f"base offset {batch.base_offset} where {next_offset} was due"
            break
        index.add(next_offset, position, batch.log_time)
        next_offset = batch.next_offset
        last_log_time = batch.log_time
        batches += 1
        valid_bytes = position + batch.stored_bytes
    return ScanResult(valid_bytes, next_offset, batches, last_log_time, error)


def iter_headers(fd: int, start: int, end: int) -> Iterator[tuple[BatchHeader, bytes]]:
    """Each batch's header and the bytes that name its keys (its
    ``table_bytes``: run table and keys) from ``start``, reading no messages.

    For lookups that need no message bytes (time search, last offset per
    key). The CRC is not checked: headers only steer reads, and every batch
    served is verified whole.
    """
    window = ReadWindow(fd, end)
    position = start
    while position < end:
        got = window.get(position, BATCH_HEADER_BYTES)
        if got is None:
            return
        header = read_header(*got)
        if isinstance(header, str):
            return
        table_got = window.get(position + BATCH_HEADER_BYTES, header.table_bytes)
        if table_got is None:
            return
        buffer, at = table_got
        yield header, buffer[at : at + header.table_bytes]
        position += header.length
