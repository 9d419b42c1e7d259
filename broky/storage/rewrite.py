"""Rewriting a partition log's files below its tail: the disk side of a
replica's truncation (KIP-101) and of a restart at a leader's log start.

Split from broky.storage.log, which decides *when* (and keeps its offsets,
durable point and caches in step); this module does the file surgery, in
the order that keeps a crash at any point recoverable by the next open
(broky.storage.recovery): doomed segments are deleted log file first, a cut
segment is truncated and fsynced before its stale index goes, and the
directory is fsynced after files appear or disappear.
"""

from __future__ import annotations

import contextlib
import os
from bisect import bisect_right
from collections.abc import Sequence

from broky.protocol.frames import Run
from broky.storage.segment import Segment, fsync_directory


def cut_segments(
    segments: Sequence[Segment], bases: Sequence[int], end: int, index_interval_bytes: int
) -> tuple[int, Segment, list[tuple[Run, int]]]:
    """Cut the files at ``end`` (inside the log): delete the segments past
    it, truncate the one holding it at the start of the batch holding it,
    and reopen that one as the active segment (the scan rebuilds its index).

    Returns the reopened segment's position in ``segments``, the segment,
    and the part of the cut batch below ``end`` as (run, ts_broker) pairs,
    which the caller appends again.
    """
    slot = bisect_right(bases, end) - 1
    segment = segments[slot]
    cut, base = segment.batch_at(end)
    kept = (
        [
            (Run(b.key, b.ts_broker, b.count, bytes(b.sizes), bytes(b.messages)), b.ts_broker)
            for b in segment.read(base, end, 1 << 62)[0]
        ]
        if base < end
        else []
    )
    for doomed in segments[slot + 1 :]:
        doomed.delete()
    segment.abandon()
    with open(segment.path, "r+b") as file:
        file.truncate(cut)
        os.fsync(file.fileno())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(segment.index_path)
    reopened, _ = Segment.open(
        segment.directory, segment.base_offset, index_interval_bytes, active=True
    )
    fsync_directory(segment.directory)
    return slot, reopened, kept


def replace_segments(
    segments: Sequence[Segment], directory: str, start: int, index_interval_bytes: int
) -> Segment:
    """Delete every segment, then create an empty active one at ``start``.

    In that order: a crash between the two leaves an empty log at 0 (what
    an open of an empty directory makes), never two segments with a gap.
    """
    for doomed in segments:
        doomed.delete()
    fresh = Segment.create(directory, start, index_interval_bytes)
    fsync_directory(directory)
    return fresh
