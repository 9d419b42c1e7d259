"""A segment's sparse index: offset -> file position and time -> file position.

One sampled table serves both lookups. Every ``interval_bytes`` of log (and
for the first batch) it records the batch's relative offset, file position
and ``log_time``. Offsets grow with position by construction, and the log
keeps ``log_time`` non-decreasing within a partition (it never stamps a batch
earlier than the one before), so the time column is sorted as well and a
separate time index file would hold the same sample points again.

The index is a cache of what the ``.log`` says: it is written once, when a
segment is sealed (rolled or closed cleanly), after the log is on disk. Its
header records the ``.log`` size it describes and a CRC32C of itself, so an
index that is torn, damaged or describes another size is *stale* and is
rebuilt by scanning the log. The active segment's index lives in memory.

File layout (little-endian)::

    0  4s  magic         b"BKI" + version 1
    4  u32 crc32c        of bytes [8, end)
    8  u32 entry_count   n
   12  u32 interval_bytes the spacing it was built with
   16  i64 base_offset   the segment's base offset
   24  u64 log_bytes     size of the .log this index describes
   32  i64 next_offset   offset after the segment's last message
   40  i64 last_log_time log_time of the segment's last batch
   48  n x u32 relative offsets, n x u32 positions, n x i64 log_times
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from typing import Final

import attrs
from crc32c import crc32c

INDEX_MAGIC: Final = b"BKI\x01"
_HEADER: Final = struct.Struct("<4sIIIqQqq")
INDEX_HEADER_BYTES: Final = _HEADER.size
#: Default spacing of index entries. A lookup reads from the entry at or
#: before the target, so this bounds the bytes scanned past it (plus one
#: batch); 4 KiB is Kafka's ``index.interval.bytes`` and costs 16 bytes of
#: index per 4 KiB of log (0.4%).
DEFAULT_INDEX_INTERVAL_BYTES: Final = 4096


@attrs.frozen(slots=True)
class IndexSummary:
    """What a valid index file says about its segment, besides the entries."""

    next_offset: int
    last_log_time: int


def _column(typecode: str, data: bytes) -> array[int]:
    column = array(typecode)
    column.frombytes(data)
    if sys.byteorder != "little":
        column.byteswap()
    return column


def _column_bytes(column: array[int]) -> bytes:
    if sys.byteorder == "little":
        return column.tobytes()
    swapped = array(column.typecode, column)
    swapped.byteswap()
    return swapped.tobytes()


class SegmentIndex:
    """Sampled ``(relative offset, position, log_time)`` entries of one segment.

    Entries are appended in log order only; lookups are binary searches. Held
    in ``array`` columns: 16 bytes per entry, so a 1 GiB segment of 4 KiB
    batches costs 4 MiB of memory.
    """

    def __init__(self, base_offset: int, interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES):
        self.base_offset = base_offset
        self.interval_bytes = interval_bytes
        self._offsets: array[int] = array("I")
        self._positions: array[int] = array("I")
        self._times: array[int] = array("q")

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def first_log_time(self) -> int | None:
        """log_time of the segment's first batch (always entry 0), if any."""
        return self._times[0] if self._times else None

    def add(self, offset: int, position: int, log_time: int) -> None:
        """Consider the batch at ``position``; keep it if it is due a sample."""
        if self._positions and position - self._positions[-1] < self.interval_bytes:
            return
        self._offsets.append(offset - self.base_offset)
        self._positions.append(position)
        self._times.append(log_time)

    def position_for_offset(self, offset: int) -> tuple[int, int]:
        """``(base offset, file position)`` of the last sampled batch starting
        at or before ``offset`` (the segment's start if none)."""
        slot = bisect_right(self._offsets, offset - self.base_offset) - 1
        if slot < 0:
            return self.base_offset, 0
        return self.base_offset + self._offsets[slot], self._positions[slot]

    def position_for_time(self, log_time: int) -> int:
        """File position of the last sampled batch whose log_time is < ``log_time``.

        Every batch before it is older than ``log_time``, so a scan for the
        first batch at or after ``log_time`` can start there.
        """
        slot = bisect_left(self._times, log_time) - 1
        return self._positions[slot] if slot >= 0 else 0

    def encode(self, log_bytes: int, summary: IndexSummary) -> bytes:
        """The index file's bytes for a ``.log`` of ``log_bytes``."""
        body = b"".join(
            (
                _HEADER.pack(
                    INDEX_MAGIC,
                    0,
                    len(self),
                    self.interval_bytes,
                    self.base_offset,
                    log_bytes,
                    summary.next_offset,
                    summary.last_log_time,
                )[8:],
                _column_bytes(self._offsets),
                _column_bytes(self._positions),
                _column_bytes(self._times),
            )
        )
        return INDEX_MAGIC + struct.pack("<I", crc32c(body)) + body

    def write(self, path: str, log_bytes: int, summary: IndexSummary) -> None:
        """Write and fsync the index file. Call only after the ``.log`` is synced.

        No rename dance: a torn index fails its CRC on the next open and is
        rebuilt from the log, which is the source of truth.
        """
        data = self.encode(log_bytes, summary)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    @classmethod
    def load(
        cls, path: str, base_offset: int, log_bytes: int
    ) -> tuple[SegmentIndex, IndexSummary] | None:
        """Read an index file; ``None`` if it is missing, damaged or stale.

        Stale means it describes another base offset or another ``.log``
        size than the one on disk now.
        """
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return None
        if len(data) < INDEX_HEADER_BYTES:
            return None
        magic, crc, count, interval, base, described_bytes, next_offset, last_time = (
            _HEADER.unpack_from(data)
        )
        if magic != INDEX_MAGIC or crc32c(memoryview(data)[8:]) != crc:
            return None
        if base != base_offset or described_bytes != log_bytes:
            return None
        if len(data) != INDEX_HEADER_BYTES + 16 * count or interval <= 0:
            return None
        index = cls(base_offset, interval)
        offsets_at = INDEX_HEADER_BYTES
        positions_at = offsets_at + 4 * count
        times_at = positions_at + 4 * count
        index._offsets = _column("I", data[offsets_at:positions_at])
        index._positions = _column("I", data[positions_at:times_at])
        index._times = _column("q", data[times_at:])
        return index, IndexSummary(next_offset, last_time)
