"""PartitionLog: the append-only, offset-addressed log of one topic partition.

Ownership: one ``PartitionLog`` per partition directory, owned by one caller
(the router that owns the partition). Its methods are synchronous and not
thread-safe, like the router's; two ``PartitionLog`` objects must never open
the same directory.

Offsets are dense and increasing: message *n* of the partition has offset
*n*, with no gaps across appends, rolls, retention and restarts. Retention
only moves ``start_offset`` forward, by whole segments.

Durability: ``end_offset`` is the offset the next message gets;
``durable_offset`` says how far an fsync has covered. With
``FsyncPolicy.ALWAYS`` the caller acknowledges a publish only once
``sync()`` has returned a ``durable_offset`` past it; one ``sync()`` covers
every batch appended since the last one (group commit).

Corruption: every batch a read returns has passed its CRC32C (reads verify;
recovery alone is not trusted, because sealed segments are not rescanned on
every open). Recovery truncates a torn tail of the active segment; damage
inside a sealed segment is reported and raises CorruptRecordError on read.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Final

from broky.protocol.constants import MAX_KEY_BYTES
from broky.protocol.frames import Run
from broky.storage.batch import encode_runs, stored_byte_ends
from broky.storage.batch_bounds import batch_bounds
from broky.storage.config import FsyncPolicy, LogConfig
from broky.storage.errors import OffsetOutOfRangeError, StorageError
from broky.storage.log_reads import LogReader
from broky.storage.log_results import AppendResult, LogStatistics, RetentionResult
from broky.storage.recovery import RecoveryReport, open_segments
from broky.storage.retention import expired_prefix
from broky.storage.rewrite import cut_segments, replace_segments
from broky.storage.segment import Segment, fsync_directory

log = logging.getLogger("broky.storage")

#: A clock: wall time in nanoseconds since the Unix epoch. Injected so that
#: tests drive rolls and retention; the log never lets its readings go
#: backwards (it keeps the maximum seen), so time lookups stay sorted.
Clock = Callable[[], int]
#: Index entries store offsets relative to the segment's base as u32.
_MAX_RELATIVE_OFFSET: Final = 0xFFFF_FFFF
#: Slack in ``append_is_quick``'s estimate.
_QUICK_MARGIN: Final = 64 * 1024
#: The producer id of a ``(producer, sequence)`` entry (read in C, once per run).
_PRODUCER: Final = itemgetter(0)
#: A record batch's message count: a u32 at byte 16 of its header (broky.storage.batch).
_BATCH_COUNT: Final = struct.Struct("<I")
_BATCH_COUNT_AT: Final = 16


class PartitionLog(LogReader):
    """Segments of one partition; see the module docstring for the rules."""

    def __init__(
        self, directory: str, config: LogConfig, clock: Clock, segments: list[Segment]
    ) -> None:
        super().__init__(directory, segments)
        self.config = config
        self._clock = clock
        self._last_log_time = max(segment.last_log_time for segment in segments)
        self._durable_offset = segments[-1].next_offset
        #: Why writes are refused after a failed fsync (None: they are not).
        self._write_failure: str | None = None
        self._last_sync = clock()
        self.recovery = RecoveryReport(directory, len(segments), 0, 0)
        self._appended_batches = 0
        self._appended_messages = 0
        self._appended_bytes = 0
        self._fsyncs = 0
        self._rolls = 0
        self._deleted_segments = 0
        #: Bumped by every cut of the log's tail (``truncate``, ``restart_at``,
        #: ``clear``): offsets read before may hold other bytes now, so a
        #: reader keeping batches across reads drops them when this changes.
        self.rewrites = 0

    # --- opening and recovery ----------------------------------------------

    @classmethod
    def open(
        cls, directory: str, config: LogConfig | None = None, clock: Clock = time.time_ns
    ) -> PartitionLog:
        """Open (creating if needed) the log in ``directory`` and recover it.

        Sealed segments with a valid index are trusted without a scan; any
        segment without one is scanned with CRC32C and its index rebuilt; a
        torn tail of the last segment is truncated. ``log.recovery`` says
        what was done, and a warning is logged when anything was cut.
        """
        config = config or LogConfig()
        segments, report = open_segments(directory, config)
        instance = cls(directory, config, clock, segments)
        instance.recovery = report
        level = logging.INFO if instance.recovery.clean else logging.WARNING
        log.log(level, "opened %s: %s", directory, instance.recovery)
        return instance

    @property
    def durable_offset(self) -> int:
        """Every offset below this one has been fsynced."""
        return self._durable_offset

    @property
    def write_failure(self) -> str | None:
        """Why this log takes no more writes (an fsync failed), or None.

        Why fail-stop: after a failed fsync the kernel may have dropped the
        dirty pages and marked them clean, so a later fsync can succeed
        without them ("fsyncgate"; PostgreSQL panics, Kafka takes the log
        directory offline). Records past ``durable_offset`` may then be
        missing from disk while the producers' dedup window still knows
        them: acking a retry of one, or anything appended after them, would
        acknowledge data that may not be there. So the log refuses writes
        until the broker restarts and recovery reads what the disk really
        holds.
        """
        return self._write_failure

    def _check_writable(self) -> None:
        self._check_open()
        if self._write_failure is not None:
            raise StorageError(self._write_failure)

    def _failed_fsync(self, exc: OSError) -> StorageError:
        self._write_failure = (
            f"an fsync of {self.directory} failed ({exc}): offsets from "
            f"{self._durable_offset} on may not be on disk, so the partition takes "
            "no more writes until the broker restarts and recovers it from disk"
        )
        log.error("%s", self._write_failure)
        return StorageError(self._write_failure)

    # --- appending -----------------------------------------------------------

    def append(
        self,
        runs: Iterable[Run],
        ts_brokers: Sequence[int] | None = None,
        producers: Sequence[tuple[int, int]] | None = None,
    ) -> AppendResult:
        """Append runs as few batches as fit (format version 2), with one ``write()``.

        The runs share batches: a batch takes runs until it reaches
        ``BATCH_TARGET_BYTES`` or its segment's size limit, so an append of
        many short runs (one group-commit round of a partition) costs one
        header, one CRC and one index entry per batch, not per run.
        ``ts_brokers``, when given, is each run's ``ts_broker`` to store
        instead of its own (the broker stamps durable runs). ``producers``,
        when given, is each run's ``(producer id, first sequence)`` ((0, 0):
        none); batches holding a producer's run are written as version 3.

        All batches of one call share one ``log_time``. A roll (by size or
        time) splits the call into one write per segment. Runs are checked
        before anything is written, so a bad run (empty, oversize) raises
        StorageError with nothing appended. A failed write (disk full)
        raises StorageError; batches written to an earlier segment by the
        same call before a roll stay, unacknowledged, like any data the
        caller did not get offsets for.

        The data is durable only per the fsync policy: with ``ALWAYS``, call
        ``sync()`` before acknowledging.
        """
        self._check_writable()
        runs = list(runs)
        if not runs:
            raise StorageError("append needs at least one run")
        if ts_brokers is not None and len(ts_brokers) != len(runs):
            raise StorageError(f"{len(ts_brokers)} ts_broker stamps for {len(runs)} runs")
        if producers is not None and len(producers) != len(runs):
            raise StorageError(f"{len(producers)} producer entries for {len(runs)} runs")
        now = self._now()
        if self._time_roll_due(now):
            self.roll()
        first = offset = self.end_offset
        encoded: list[tuple[int, int, bytes]] = []
        ends = stored_byte_ends(runs)
        for start, stop in batch_bounds(ends, self._segments[-1].size, self.config.segment_bytes):
            group = runs[start:stop]
            stamps = None if ts_brokers is None else ts_brokers[start:stop]
            identities = None if producers is None else producers[start:stop]
            if identities is not None and not any(map(_PRODUCER, identities)):
                identities = None  # no idempotent run: a version 2 batch
            data = encode_runs(offset, now, group, stamps, identities)
            # Read off the batch header, not summed over the runs: no Python step per run.
            (count,) = _BATCH_COUNT.unpack_from(data, _BATCH_COUNT_AT)
            encoded.append((offset, count, data))
            offset += count
        parts: list[bytes] = []
        positions: list[tuple[int, int, int]] = []
        pending = 0
        for base, count, data in encoded:
            active = self._segments[-1]
            written = active.size + pending
            if written and (
                written + len(data) > self.config.segment_bytes
                or base + count - active.base_offset > _MAX_RELATIVE_OFFSET
            ):
                self._write(parts, positions, base)
                parts, positions, pending = [], [], 0
                self.roll()
            positions.append((base, pending, now))
            parts.append(data)
            pending += len(data)
        self._write(parts, positions, offset)
        last_by_key = self._last_by_key
        if last_by_key is not None:
            end = first
            for run in runs:
                end += run.count
                last_by_key[run.key] = end - 1
        self._appended_messages += offset - first
        if self.config.fsync is FsyncPolicy.INTERVAL:
            self._sync_if_due(now)
        return AppendResult(first, offset - 1)

    def append_is_quick(self, nbytes: int, messages: int, runs: int) -> bool:
        """Whether appending ``runs`` runs (``messages`` messages, ``nbytes``
        message bytes) is one ``write()`` to the page cache, no roll (it
        fsyncs) and no interval fsync: an owner may do it on its event loop
        (broky.durable.owner). The stored size is over-estimated."""
        if self.config.fsync is FsyncPolicy.INTERVAL or self._time_roll_due(self._now()):
            return False
        active = self._segments[-1]
        stored = nbytes + 8 * messages + (MAX_KEY_BYTES + 64) * runs + _QUICK_MARGIN
        if active.size + stored > self.config.segment_bytes:
            return False
        return self.end_offset + messages - active.base_offset <= _MAX_RELATIVE_OFFSET

    def _write(self, parts: list[bytes], positions: list[tuple[int, int, int]], end: int) -> None:
        if not parts:
            return
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self._segments[-1].append(data, end, positions)
        self._last_log_time = positions[-1][2]
        self._appended_batches += len(parts)
        self._appended_bytes += len(data)

    def sync(self) -> int:
        """fsync everything appended so far (group commit); return ``durable_offset``.

        Cheap when nothing is pending. Sealed segments were synced when they
        rolled, so one fdatasync of the active segment covers everything.
        Blocking: the broker calls it once per batch of appends, not per
        publish.
        """
        self._check_writable()
        end = self.end_offset
        if self._durable_offset < end:
            try:
                self._segments[-1].sync()
            except OSError as exc:
                raise self._failed_fsync(exc) from exc
            self._fsyncs += 1
            self._durable_offset = end
        self._last_sync = self._clock()
        return self._durable_offset

    def truncate(self, end: int) -> None:
        """Drop every offset at or after ``end``, durably (a replica whose
        tail a new leader never had: broky.replication, KIP-101).

        Whole segments past ``end`` are deleted; the segment holding it is
        cut at the batch that holds ``end`` and reopened as the active one
        (broky.storage.rewrite), and the part of that batch below ``end`` is
        appended again. Offsets below ``end`` keep their bytes.
        """
        self._check_writable()
        if end >= self.end_offset:
            return
        if end < self.start_offset:
            raise OffsetOutOfRangeError(end, self.start_offset, self.end_offset)
        slot, reopened, kept = cut_segments(
            self._segments, self._bases, end, self.config.index_interval_bytes
        )
        self._segments[slot:] = [reopened]
        self._bases[slot:] = [reopened.base_offset]
        self._durable_offset = min(self._durable_offset, reopened.next_offset)
        self._last_by_key = None
        self.rewrites += 1
        if kept:
            self.append([run for run, _ in kept], [stamp for _, stamp in kept])
        self.sync()

    def restart_at(self, start: int) -> None:
        """Drop every segment and continue, empty, at ``start`` (Kafka's
        truncateFullyAndStartAt): a follower whose whole log lies below its
        leader's log start, which retention moved past it, can never fill
        that gap, so it keeps nothing and fetches from ``start``.

        A crash in the middle leaves an empty log at 0, whose next fetch is
        refused and restarts it again (broky.storage.rewrite).
        """
        self._check_writable()
        if start < self.end_offset:
            raise OffsetOutOfRangeError(start, self.end_offset, self.end_offset)
        if start == self.end_offset:
            return
        self._replace(start)

    def clear(self) -> None:
        """Drop every record and continue, empty, at offset 0: the copy of a
        replica this node no longer holds (broky.replication.dropped), so if
        it is placed here again it fetches the whole log afresh."""
        self._check_writable()
        self._replace(0)

    def _replace(self, start: int) -> None:
        self.rewrites += 1
        fresh = replace_segments(
            self._segments, self.directory, start, self.config.index_interval_bytes
        )
        self._deleted_segments += len(self._segments)
        self._segments = [fresh]
        self._bases = [start]
        self._durable_offset = start
        self._last_by_key = None

    def tick(self) -> None:
        """Periodic housekeeping: the ``INTERVAL`` fsync, time rolls, retention.

        The broker calls this every so often (a fraction of the fsync
        interval), so that an idle partition still syncs, rolls and expires.
        """
        self._check_open()
        if self._write_failure is not None:
            return  # reported once when the fsync failed; nothing may be written
        now = self._now()
        if self.config.fsync is FsyncPolicy.INTERVAL:
            self._sync_if_due(now)
        if self._time_roll_due(now):
            self.roll()
        self.enforce_retention()

    def housekeeping_delay(self) -> float | None:
        """Seconds until ``tick`` has work (0.0: now; None: not without new
        writes): an ``INTERVAL`` fsync of unsynced data, a time roll, or
        retention. Read-only: a partition's owner asks it on the event loop
        and hands a tick to a thread only when it has work (a hand-off every
        0.2 s per idle partition cost a broker of 64 of them 13 % of a
        core). The fsync clock of an idle partition is not reset by empty
        syncs: the first data after a pause is synced at the next tick."""
        if self._closed or self._write_failure is not None:
            return None
        now = self._now()
        segments = self._segments
        age = self.config.retention_ns
        if self.config.retention_bytes is not None and expired_prefix(
            [segment.size for segment in segments],
            [segment.last_log_time for segment in segments],
            now,
            age,
            self.config.retention_bytes,
        ):
            return 0.0  # retention removes segments now (by bytes, or by age)
        waits: list[int] = []
        if self.config.fsync is FsyncPolicy.INTERVAL and self._durable_offset < self.end_offset:
            waits.append(self._last_sync + self.config.fsync_interval_ns - now)
        roll = self._roll_deadline()
        if roll is not None:
            waits.append(roll - now)
        if age is not None:
            # Segments age oldest first; the active one is rolled once idle.
            # Both compare strictly (older than ``now - age``): due 1 ns later.
            if len(segments) > 1:
                waits.append(segments[0].last_log_time + age + 1 - now)
            if segments[-1].size:
                waits.append(segments[-1].last_log_time + age + 1 - now)
        if not waits:
            return None
        return max(0.0, min(waits) / 1e9)

    def _sync_if_due(self, now: int) -> None:
        if now - self._last_sync >= self.config.fsync_interval_ns:
            self.sync()

    def _now(self) -> int:
        now = self._clock()
        return now if now > self._last_log_time else self._last_log_time

    def _time_roll_due(self, now: int) -> bool:
        deadline = self._roll_deadline()
        return deadline is not None and now >= deadline

    def _roll_deadline(self) -> int | None:
        """When the active segment rolls by time (None: no schedule, or empty)."""
        schedule = self.config.roll
        first = self._segments[-1].first_log_time
        return None if schedule is None or first is None else schedule.deadline(first)

    # --- segments ------------------------------------------------------------

    def roll(self) -> None:
        """Seal the active segment and start a new one at ``end_offset``.

        Does nothing when the active segment is empty. Sealing fsyncs the
        old segment whatever the fsync policy, so that only the active
        segment can ever hold a torn tail.
        """
        self._check_writable()
        active = self._segments[-1]
        if not active.size:
            return
        try:
            active.seal()
        except OSError as exc:
            raise self._failed_fsync(exc) from exc
        self._durable_offset = max(self._durable_offset, active.next_offset)
        segment = Segment.create(
            self.directory, active.next_offset, self.config.index_interval_bytes
        )
        fsync_directory(self.directory)
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._rolls += 1

    def enforce_retention(self) -> RetentionResult:
        """Delete the oldest sealed segments that retention no longer keeps
        (the rule: ``broky.storage.retention.expired_prefix``); an idle
        active segment older than ``retention_seconds`` is rolled first, so
        it can go too."""
        self._check_open()
        age = self.config.retention_ns
        limit = self.config.retention_bytes
        now = self._now()
        active = self._segments[-1]
        if age is not None and active.size and active.last_log_time < now - age:
            self.roll()
        segments = self._segments
        deleted = expired_prefix(
            [segment.size for segment in segments],
            [segment.last_log_time for segment in segments],
            now,
            age,
            limit,
        )
        deleted_bytes = sum(segment.size for segment in segments[:deleted])
        for _ in range(deleted):
            segments[0].delete()
            del segments[0], self._bases[0]
        if deleted:
            fsync_directory(self.directory)
            self._deleted_segments += deleted
            log.info(
                "%s: retention deleted %d segments (%d bytes); start offset now %d",
                self.directory,
                deleted,
                deleted_bytes,
                self.start_offset,
            )
        return RetentionResult(deleted, deleted_bytes, self.start_offset)

    # --- lifecycle -----------------------------------------------------------

    def statistics(self) -> LogStatistics:
        return LogStatistics(*self.counters())

    def counters(self) -> tuple[int, ...]:
        """``statistics`` as a plain tuple, in its fields' order: what a
        partition's owner copies after every round (a tuple costs a fraction
        of the frozen snapshot, which it builds only when asked)."""
        return (
            self.start_offset,
            self.end_offset,
            self._durable_offset,
            len(self._segments),
            sum(segment.size for segment in self._segments),
            self._appended_batches,
            self._appended_messages,
            self._appended_bytes,
            self._fsyncs,
            self._rolls,
            self._deleted_segments,
        )

    def close(self) -> None:
        """Clean shutdown: fsync, write the active segment's index, close files.

        The next open then trusts every index and scans nothing.
        """
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            segment.close()

    def abandon(self) -> None:
        """Drop the log as a crash would: no fsync, no index. For tests."""
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            with contextlib.suppress(OSError):
                segment.abandon()

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
