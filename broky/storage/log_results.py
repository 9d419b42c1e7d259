"""What a partition log's operations return: the offsets an append gave,
what a retention pass deleted, a snapshot of its counters.

Plain values apart from ``broky.storage.log``, so that a log's callers
(the partition owner, metrics) name them without the log's machinery.
"""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class AppendResult:
    """Offsets given to an append: ``first_offset`` to ``last_offset``
    inclusive, in the order of the runs (run *i* starts after the counts of
    the runs before it)."""

    first_offset: int
    last_offset: int

    @property
    def count(self) -> int:
        return self.last_offset - self.first_offset + 1


@attrs.frozen(slots=True)
class RetentionResult:
    """What one retention pass deleted."""

    deleted_segments: int
    deleted_bytes: int
    start_offset: int


@attrs.frozen(slots=True)
class LogStatistics:
    """A snapshot of a log's counters since it was opened."""

    start_offset: int
    end_offset: int
    durable_offset: int
    segments: int
    size_bytes: int
    appended_batches: int
    appended_messages: int
    appended_bytes: int
    fsyncs: int
    rolls: int
    deleted_segments: int
