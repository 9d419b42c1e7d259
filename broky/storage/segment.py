"""One segment: a ``<base-offset>.log`` of batches and its ``.index``.

A partition log is a directory of segments named by their base offset (the
offset of their first message) in 20 digits, so that names sort as numbers:
``00000000000000000000.log``, ``00000000000000052311.log``, ... Only the last
segment is written to (the *active* one); the others are *sealed*: fsynced,
immutable, with an index file on disk.

This module does file work only: append a buffer, read verified batches,
scan and repair. Offsets, rolling, retention and fsync policy belong to
``PartitionLog``; the sequential reads (window, CRC scan, header walk) are in
``broky.storage.segment_scan``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Final

import attrs

from broky.storage.batch import BATCH_HEADER_BYTES, StoredBatch
from broky.storage.batch_reading import BatchSpan, RecordBatch, decode_batch, read_header
from broky.storage.errors import CorruptRecordError, StorageError
from broky.storage.index import IndexSummary, SegmentIndex
from broky.storage.segment_scan import READ_WINDOW_BYTES, ReadWindow, iter_headers, scan

log = logging.getLogger("broky.storage")

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
#: Digits of a segment's base offset in its file name: the width of the
#: largest u64, so that lexical order is numeric order (Kafka's convention).
OFFSET_DIGITS: Final = 20


def segment_stem(base_offset: int) -> str:
    """The file name of a segment without its suffix."""
    return f"{base_offset:0{OFFSET_DIGITS}d}"


def parse_stem(name: str, suffix: str) -> int | None:
    """The base offset a segment file name encodes, or None if it is not ours."""
    stem = name[: -len(suffix)]
    if not name.endswith(suffix) or len(stem) != OFFSET_DIGITS or not stem.isdigit():
        return None
    return int(stem)


def fsync_directory(directory: str) -> None:
    """Make file creations and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@attrs.frozen(slots=True)
class SegmentRepair:
    """What opening one segment took: a scan, a truncation, a new index."""

    base_offset: int
    scanned_batches: int = 0
    truncated_bytes: int = 0
    index_rebuilt: bool = False
    corrupt: str | None = None


class Segment:
    """One segment's files. Not thread-safe; its ``PartitionLog`` owns it."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        index: SegmentIndex,
        size: int,
        next_offset: int,
        last_log_time: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index = index
        #: Bytes of valid batches; reads never pass it.
        self.size = size
        self.next_offset = next_offset
        #: log_time of the last batch (0 while empty); retention compares it.
        self.last_log_time = last_log_time
        stem = os.path.join(directory, segment_stem(base_offset))
        self.path = stem + LOG_SUFFIX
        self.index_path = stem + INDEX_SUFFIX
        self._write_fd: int | None = None
        self._read_fd: int | None = None
        #: The last batch a read decoded, at its byte position, and the read
        #: window over ``_read_fd`` (``_verified``).
        self._last_verified: tuple[int, RecordBatch] | None = None
        self._window: ReadWindow | None = None

    def __repr__(self) -> str:
        return f"Segment({self.path!r}, offsets [{self.base_offset}, {self.next_offset}))"

    @property
    def sealed(self) -> bool:
        return self._write_fd is None

    @property
    def first_log_time(self) -> int | None:
        return self.index.first_log_time

    @classmethod
    def create(cls, directory: str, base_offset: int, index_interval_bytes: int) -> Segment:
        """A new, empty, active segment. The caller fsyncs the directory."""
        index = SegmentIndex(base_offset, index_interval_bytes)
        segment = cls(directory, base_offset, index, 0, base_offset, 0)
        segment._write_fd = os.open(
            segment.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644
        )
        return segment

    @classmethod
    def open(
        cls, directory: str, base_offset: int, index_interval_bytes: int, *, active: bool
    ) -> tuple[Segment, SegmentRepair]:
        """Open an existing segment, trusting its index only if it matches the log.

        A segment without a valid index is scanned with CRC32C. In the active
        segment a bad batch is a torn tail: the file is truncated there and
        fsynced. In a sealed segment it is damage: nothing is cut (later
        segments hold good data), the segment is reported corrupt, and reads
        that reach the damage raise CorruptRecordError.
        """
        stem = os.path.join(directory, segment_stem(base_offset))
        size = os.stat(stem + LOG_SUFFIX).st_size
        loaded = SegmentIndex.load(stem + INDEX_SUFFIX, base_offset, size)
        if loaded is not None:
            index, summary = loaded
            segment = cls(
                directory, base_offset, index, size, summary.next_offset, summary.last_log_time
            )
            repair = SegmentRepair(base_offset)
        else:
            index = SegmentIndex(base_offset, index_interval_bytes)
            fd = os.open(stem + LOG_SUFFIX, os.O_RDONLY)
            try:
                result = scan(fd, base_offset, size, index)
            finally:
                os.close(fd)
            segment = cls(
                directory,
                base_offset,
                index,
                result.valid_bytes,
                result.next_offset,
                result.last_log_time,
            )
            truncated = 0
            corrupt = None
            if result.error is not None:
                if active:
                    truncated = size - result.valid_bytes
                    log.warning(
                        "%s: torn tail at byte %d (%s): truncating %d bytes",
                        segment.path,
                        result.valid_bytes,
                        result.error,
                        truncated,
                    )
                    with open(segment.path, "r+b") as file:
                        file.truncate(result.valid_bytes)
                        os.fsync(file.fileno())
                else:
                    # Keep the damaged bytes in range: reads that reach them must
                    # fail loudly rather than skip to the next segment (a gap).
                    segment.size = size
                    corrupt = f"{result.error} at byte {result.valid_bytes}"
                    log.error("%s: damaged sealed segment: %s", segment.path, corrupt)
            if not active and corrupt is None:
                segment.write_index()
            repair = SegmentRepair(
                base_offset, result.batches, truncated, index_rebuilt=True, corrupt=corrupt
            )
        if active:
            segment._write_fd = os.open(segment.path, os.O_WRONLY | os.O_APPEND)
            # What a crashed process left in the page cache is readable but not
            # yet durable; one fsync now makes "recovered" mean "on disk".
            os.fdatasync(segment._write_fd)
        return segment, repair

    def write_index(self) -> None:
        """Write this segment's index file (the log must already be synced)."""
        summary = IndexSummary(self.next_offset, self.last_log_time)
        self.index.write(self.index_path, self.size, summary)

    def append(self, data: bytes, next_offset: int, positions: list[tuple[int, int, int]]) -> None:
        """Write ``data`` (whole batches) with one ``write()``.

        ``positions`` lists ``(base offset, position in data, log_time)`` of
        each batch, for the index. On a short write (disk full) the file is
        cut back to where it was, so no partial batch stays behind, and
        StorageError is raised; the segment is unchanged.
        """
        fd = self._write_fd
        if fd is None:
            raise StorageError(f"{self.path} is sealed")
        try:
            written = os.write(fd, data)
        except OSError as exc:
            written = -1
            failure = str(exc)
        else:
            failure = f"short write of {written} of {len(data)} bytes"
        if written != len(data):
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self.size)
            raise StorageError(f"append to {self.path} failed: {failure}")
        for offset, position, log_time in positions:
            self.index.add(offset, self.size + position, log_time)
        self.size += len(data)
        self.next_offset = next_offset
        self.last_log_time = positions[-1][2]

    def sync(self) -> None:
        """fdatasync the log: the data and the file size, not the mtime."""
        if self._write_fd is not None:
            os.fdatasync(self._write_fd)

    def seal(self) -> None:
        """Make the segment immutable: sync, write the index, close for writing."""
        if self._write_fd is None:
            return
        os.fdatasync(self._write_fd)
        os.close(self._write_fd)
        self._write_fd = None
        self.write_index()

    def _reader(self) -> int:
        if self._read_fd is None:
            self._read_fd = os.open(self.path, os.O_RDONLY)
        return self._read_fd

    def read(
        self, start: int, stop: int, max_bytes: int, used: int = 0
    ) -> tuple[list[StoredBatch], int]:
        """Verified runs covering offsets from ``start`` (< ``stop``).

        Returns the runs (the first and last sliced to ``[start, stop)``)
        and ``used`` plus the stored bytes they account for. Reads whole
        runs while the total fits in ``max_bytes``, and at least one when
        ``used`` is 0, so that a reader makes progress past a run larger
        than its budget. Every run served comes from a batch that passed its
        CRC32C; a bad one raises CorruptRecordError.
        """
        runs: list[StoredBatch] = []
        for batch in self._verified(start, stop, max_bytes):
            for run in batch.runs(start, stop):
                if used and used + run.stored_bytes > max_bytes:
                    return runs, used
                runs.append(run)
                used += run.stored_bytes
        return runs, used

    def read_spans(
        self, start: int, stop: int, max_bytes: int, used: int = 0
    ) -> tuple[list[BatchSpan], int]:
        """:meth:`read` by whole stored batches: one span per batch (sliced
        to ``[start, stop)``), each counting its batch's whole stored bytes."""
        spans: list[BatchSpan] = []
        for batch in self._verified(start, stop, max_bytes):
            if used and used + batch.stored_bytes > max_bytes:
                break
            spans.append(
                BatchSpan(batch, max(start, batch.base_offset), min(stop, batch.next_offset))
            )
            used += batch.stored_bytes
        return spans, used

    def forget_verified(self) -> None:
        """Let go of the kept batch and read window (up to a read's
        ``max_bytes``): done when the log reads another segment."""
        self._last_verified = None
        self._window = None

    def _verified(self, start: int, stop: int, max_bytes: int) -> Iterator[RecordBatch]:
        """The verified batches holding offsets in ``[start, stop)``, in order.

        The last batch decoded and the read window are kept: a consumer's
        next read usually begins inside that batch (reads stop mid-batch at
        their caller's budget), served again with no ``pread`` or second
        CRC32C, and the batches after it come from the same window. Bytes
        never change under a segment (it only grows; a truncation reopens
        a new ``Segment``), so what is kept stays right."""
        kept = self._last_verified
        if kept is not None and kept[1].base_offset <= start < kept[1].next_offset:
            position, batch = kept
            yield batch
            expected, position = batch.next_offset, position + batch.stored_bytes
        else:
            expected, position = self.index.position_for_offset(start)
        window = self._window
        if window is None:
            window = self._window = ReadWindow(self._reader(), 0)
        window.end, window.window = self.size, max(READ_WINDOW_BYTES // 16, max_bytes)
        while position < self.size and expected < stop:
            got = window.get(position, BATCH_HEADER_BYTES)
            header = read_header(*got) if got is not None else "truncated header"
            if not isinstance(header, str) and header.base_offset != expected:
                header = f"base offset {header.base_offset} where {expected} was due"
            if isinstance(header, str):
                raise CorruptRecordError(f"corrupt batch: {header}", self.path, position)
            expected = header.next_offset
            if header.next_offset > start:
                got = window.get(position, header.length)
                if got is None:
                    raise CorruptRecordError("batch runs past the segment", self.path, position)
                buffer, at = got
                batch = decode_batch(buffer, at, self.path, position - at)
                self._last_verified = (position, batch)
                yield batch
            position += header.length

    def batch_at(self, offset: int) -> tuple[int, int]:
        """``(byte position, base offset)`` of the batch holding ``offset``
        (``(size, next_offset)`` past the end): where a truncation cuts."""
        position = self.index.position_for_offset(offset)[1]
        for header, _table in iter_headers(self._reader(), position, self.size):
            if header.next_offset > offset:
                return position, header.base_offset
            position += header.length
        return self.size, self.next_offset

    def offset_for_time(self, log_time: int) -> int:
        """The first offset whose batch has ``log_time`` at or after the given one."""
        start = self.index.position_for_time(log_time)
        for header, _table in iter_headers(self._reader(), start, self.size):
            if header.log_time >= log_time:
                return header.base_offset
        return self.next_offset

    def last_offsets(self) -> dict[bytes, int]:
        """The last offset of each key in this segment (a header-only scan)."""
        last: dict[bytes, int] = {}
        for header, table in iter_headers(self._reader(), 0, self.size):
            last.update(header.key_last_offsets(table))
        return last

    def producer_runs(self) -> Iterator[tuple[int, int, int, int]]:
        """The idempotent producers' runs of this segment (a header-only
        scan; ``BatchHeader.producer_runs``)."""
        for header, table in iter_headers(self._reader(), 0, self.size):
            yield from header.producer_runs(table)

    def close(self) -> None:
        """Close the files; an active segment is sealed first (clean shutdown)."""
        self.seal()
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None
        self._window = None

    def abandon(self) -> None:
        """Close file descriptors without syncing or writing the index.

        What a crash leaves behind, for tests; also used after a failed open.
        """
        for fd in (self._write_fd, self._read_fd):
            if fd is not None:
                os.close(fd)
        self._write_fd = self._read_fd = None
        self._window = None

    def delete(self) -> None:
        """Remove the segment's files (the ``.log`` first: an orphan index is
        harmless and removed on the next open, an orphan log is not)."""
        self.abandon()
        for path in (self.path, self.index_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
