"""Opening a partition log's directory: find its segments and repair them.

Split from broky.storage.log, which owns a log once it is open: this is the
part that runs once per open and trusts nothing on disk (orphan indexes,
missing or stale indexes, a torn tail of the active segment, gaps between
sealed segments), and says in a ``RecoveryReport`` what it found and did.
"""

from __future__ import annotations

import logging
import os

import attrs

from broky.storage.config import LogConfig
from broky.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    Segment,
    fsync_directory,
    parse_stem,
)

log = logging.getLogger("broky.storage")


@attrs.frozen(slots=True)
class RecoveryReport:
    """What opening a log found and repaired. ``clean`` when nothing was."""

    directory: str
    segments: int
    start_offset: int
    end_offset: int
    segments_scanned: int = 0
    batches_scanned: int = 0
    truncated_bytes: int = 0
    indexes_rebuilt: int = 0
    orphans_removed: int = 0
    corrupt_segments: tuple[int, ...] = ()

    @property
    def clean(self) -> bool:
        """Nothing was cut and nothing is damaged (rebuilt indexes are fine)."""
        return not (self.truncated_bytes or self.corrupt_segments)


def open_segments(directory: str, config: LogConfig) -> tuple[list[Segment], RecoveryReport]:
    """The segments of the log in ``directory`` (created empty if there are
    none), repaired, and what was found.

    Sealed segments with a valid index are trusted without a scan; any
    segment without one is scanned with CRC32C and its index rebuilt; a
    torn tail of the last segment is truncated; a sealed segment that does
    not end where the next begins is marked corrupt (reads of it raise).
    """
    os.makedirs(directory, exist_ok=True)
    names = os.listdir(directory)
    bases = sorted(b for b in (parse_stem(n, LOG_SUFFIX) for n in names) if b is not None)
    orphans = 0
    for name in names:
        base = parse_stem(name, INDEX_SUFFIX)
        if base is not None and base not in bases:
            os.unlink(os.path.join(directory, name))
            orphans += 1
    segments: list[Segment] = []
    corrupt: list[int] = []
    scanned = batches = truncated = rebuilt = 0
    try:
        for position, base in enumerate(bases):
            active = position == len(bases) - 1
            segment, repair = Segment.open(
                directory, base, config.index_interval_bytes, active=active
            )
            segments.append(segment)
            if repair.index_rebuilt:
                scanned += 1
                rebuilt += 1
            batches += repair.scanned_batches
            truncated += repair.truncated_bytes
            if not active and segment.next_offset != bases[position + 1]:
                if repair.corrupt is None:
                    log.error(
                        "%s ends at offset %d but the next segment starts at %d",
                        segment.path,
                        segment.next_offset,
                        bases[position + 1],
                    )
                segment.next_offset = bases[position + 1]
                corrupt.append(base)
            elif repair.corrupt is not None:
                corrupt.append(base)
    except BaseException:
        for segment in segments:
            segment.abandon()
        raise
    if not segments:
        segments = [Segment.create(directory, 0, config.index_interval_bytes)]
        fsync_directory(directory)
    report = RecoveryReport(
        directory,
        len(segments),
        segments[0].base_offset,
        segments[-1].next_offset,
        segments_scanned=scanned,
        batches_scanned=batches,
        truncated_bytes=truncated,
        indexes_rebuilt=rebuilt,
        orphans_removed=orphans,
        corrupt_segments=tuple(corrupt),
    )
    return segments, report
