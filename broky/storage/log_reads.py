"""The read side of a partition log: offsets, verified reads and lookups.

``LogReader`` is the base class of ``PartitionLog`` (broky.storage.log),
which adds appending, syncing, rolling and retention; both work on the same
list of segments, owned by the one caller that owns the log (see
broky.storage.log for the ownership, offset and corruption rules). Nothing
here writes: every batch a read returns has passed its CRC32C.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import Final, Protocol, TypeVar

from broky.storage.batch import StoredBatch
from broky.storage.batch_reading import BatchSpan
from broky.storage.errors import CorruptRecordError, OffsetOutOfRangeError, StorageError
from broky.storage.segment import Segment

#: Default byte budget of ``read``: what one Deliver frame can carry with
#: room to spare under the 4 MiB frame limit.
DEFAULT_READ_BYTES: Final = 1024 * 1024


class _Ends(Protocol):
    @property
    def next_offset(self) -> int: ...


_Read = TypeVar("_Read", bound=_Ends)


class LogReader:
    """Reads and lookups over a partition's segments (oldest first; the last is active)."""

    def __init__(self, directory: str, segments: list[Segment]) -> None:
        self.directory = directory
        self._segments = segments
        #: Each segment's base offset, for the binary search of ``read``.
        self._bases = [segment.base_offset for segment in segments]
        #: The last offset of each key, built by the first ``last_offsets``.
        self._last_by_key: dict[bytes, int] | None = None
        #: The segment whose last decoded batch is kept (``Segment._verified``):
        #: one per log, so that reading on elsewhere frees its read buffer.
        self._last_read: Segment | None = None
        self._closed = False

    # --- offsets -------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """The oldest offset still held (retention moves it forward)."""
        return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        """The offset the next appended message will get."""
        return self._segments[-1].next_offset

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments, oldest first; the last one is active. Read-only use."""
        return tuple(self._segments)

    # --- reading -------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int = DEFAULT_READ_BYTES, stop_offset: int | None = None
    ) -> list[StoredBatch]:
        """Verified batches from ``offset``, up to ``stop_offset`` (default: the end).

        The first batch starts exactly at ``offset`` (sliced if ``offset``
        falls inside a stored batch), and none passes ``stop_offset``. Whole
        batches are returned while their on-disk size fits in ``max_bytes``,
        and always at least one when any is available. Pass
        ``durable_offset`` as ``stop_offset`` to serve only fsynced data.
        An offset outside ``[start_offset, end_offset]`` raises
        OffsetOutOfRangeError; ``end_offset`` itself gives ``[]``.
        """
        return self._collect(Segment.read, offset, max_bytes, stop_offset)

    def read_spans(
        self, offset: int, max_bytes: int = DEFAULT_READ_BYTES, stop_offset: int | None = None
    ) -> list[BatchSpan]:
        """:meth:`read` by whole stored batches (``Segment.read_spans``): one
        object per batch read rather than one per run, for a reader that
        lays the runs out itself (durable subscriptions)."""
        return self._collect(Segment.read_spans, offset, max_bytes, stop_offset)

    def _collect(
        self,
        read_segment: Callable[[Segment, int, int, int, int], tuple[list[_Read], int]],
        offset: int,
        max_bytes: int,
        stop_offset: int | None,
    ) -> list[_Read]:
        """The segment walk of :meth:`read` and :meth:`read_spans`."""
        self._check_open()
        end = self.end_offset
        if not self.start_offset <= offset <= end:
            raise OffsetOutOfRangeError(offset, self.start_offset, end)
        stop = end if stop_offset is None else min(stop_offset, end)
        batches: list[_Read] = []
        used = 0
        slot = bisect_right(self._bases, offset) - 1
        while offset < stop and slot < len(self._segments):
            segment = self._segments[slot]
            if segment is not self._last_read:
                if self._last_read is not None:
                    self._last_read.forget_verified()
                self._last_read = segment
            found, used = read_segment(segment, offset, stop, max_bytes, used)
            batches.extend(found)
            if found:
                offset = found[-1].next_offset
            if offset < segment.next_offset and offset < stop:
                if used:
                    break  # the byte budget ran out inside this segment
                raise CorruptRecordError(
                    f"offsets {offset} to {segment.next_offset} are missing", segment.path
                )
            slot += 1
        return batches

    def offset_for_time(self, log_time: int) -> int:
        """The first offset appended at or after ``log_time`` (ns since the
        epoch), or ``end_offset`` if none: the start of a replay by time."""
        self._check_open()
        for segment in self._segments:
            if segment.size and segment.last_log_time >= log_time:
                return max(segment.offset_for_time(log_time), self.start_offset)
        return self.end_offset

    def last_offsets(self) -> dict[bytes, int]:
        """The offset of the last message of each key still held.

        What a late joiner asking for ``last`` needs. The first call scans
        every segment's batch headers (no message bytes); appends keep the
        table current after that. Memory: one entry per distinct key.
        """
        self._check_open()
        if self._last_by_key is None:
            table: dict[bytes, int] = {}
            for segment in self._segments:
                table.update(segment.last_offsets())
            self._last_by_key = table
        start = self.start_offset
        stale = [key for key, offset in self._last_by_key.items() if offset < start]
        for key in stale:
            del self._last_by_key[key]
        return dict(self._last_by_key)

    def producer_runs(self, tail_bytes: int) -> Iterator[tuple[int, int, int, int]]:
        """``(producer id, first sequence, count, first offset)`` of every
        idempotent producer's run in the last segments holding at least
        ``tail_bytes`` of the log (whole segments, oldest first), from batch
        headers and run tables only: what rebuilds an owner's deduplication
        window after a restart."""
        self._check_open()
        first = len(self._segments) - 1
        held = self._segments[first].size
        while first > 0 and held < tail_bytes:
            first -= 1
            held += self._segments[first].size
        for segment in self._segments[first:]:
            yield from segment.producer_runs()

    def read_last(self, keys: Callable[[bytes], bool] | None = None) -> list[StoredBatch]:
        """The last message of each key (that ``keys`` accepts), oldest first.

        Each comes back as a one-message batch, ready to replay.
        """
        wanted = sorted(
            offset for key, offset in self.last_offsets().items() if keys is None or keys(key)
        )
        return [self.read(offset, 1, offset + 1)[0] for offset in wanted]

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.directory} is closed")
