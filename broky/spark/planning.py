"""Offsets and input partitions, as plain values: no Spark, no I/O.

Everything that decides *which* messages a read or a micro-batch covers
lives here so that it can be unit-tested without a SparkSession. Offsets are
Broky's: dense per partition, ``end`` is the next offset to be written, and
every range is half-open ``[start, stop)``.

Streaming offsets travel through Spark's checkpoint as JSON, and Spark
decides whether a micro-batch has new data by comparing that JSON as text,
so ``StreamOffsets`` always builds its dict in one canonical order (topics
sorted, partitions in numeric order): the same positions give the same
text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

#: ``stop`` of a range that runs to whatever the log holds when it is read
#: (offline reads, where the end of the active segment is not known ahead).
TO_END: Final = -1


class OffsetsError(ValueError):
    """Offsets given by the user or found in a checkpoint make no sense."""


@attrs.frozen(slots=True)
class PartitionSpan:
    """What one partition holds: offsets ``[start, end)`` (``end`` TO_END if unknown)."""

    topic: str
    partition: int
    start: int
    end: int


@attrs.frozen(slots=True)
class OffsetRange:
    """Offsets ``[start, stop)`` of one partition: the work of one Spark task."""

    topic: str
    partition: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        """Messages in the range (offsets are dense); unknown (-1) if open-ended."""
        return -1 if self.stop == TO_END else self.stop - self.start


@attrs.frozen(slots=True)
class TopicSelection:
    """Which topics and partitions to read: exact names, a regex, partition numbers.

    Empty ``names`` and no ``pattern`` select every topic; empty
    ``partitions`` selects every partition.
    """

    names: frozenset[str] = frozenset()
    pattern: re.Pattern[str] | None = None
    partitions: frozenset[int] = frozenset()

    def topic_selected(self, topic: str) -> bool:
        """Whether ``topic`` is one of the topics to read."""
        if self.names and topic not in self.names:
            return False
        return self.pattern is None or self.pattern.fullmatch(topic) is not None

    def selected(self, topic: str, partition: int) -> bool:
        """Whether partition ``partition`` of ``topic`` is to be read."""
        if self.partitions and partition not in self.partitions:
            return False
        return self.topic_selected(topic)


#: Per-topic, per-partition offsets as the options spell them:
#: ``{"orders": {"0": 42}}``; a plain int applies to every partition.
OffsetSpec = int | str | Mapping[str, Mapping[str, int]]


def spec_offset(spec: OffsetSpec, topic: str, partition: int, default: int) -> int:
    """The offset ``spec`` gives partition ``partition`` of ``topic``.

    "earliest", "latest" and partitions a mapping leaves out give ``default``
    (the caller passes the partition's start or end).
    """
    if isinstance(spec, int):
        return spec
    if isinstance(spec, str):
        return default
    value = spec.get(topic, {}).get(str(partition))
    return default if value is None else int(value)


def batch_ranges(
    spans: Iterable[PartitionSpan],
    starting: OffsetSpec = "earliest",
    ending: OffsetSpec = "latest",
    max_rows_per_range: int = 0,
) -> list[OffsetRange]:
    """The ranges a batch read covers: one per partition, split every
    ``max_rows_per_range`` messages (0: never) so that a big partition is read
    by several tasks. Empty ranges are dropped."""
    ranges = []
    for span in spans:
        start = max(spec_offset(starting, span.topic, span.partition, span.start), span.start)
        stop = spec_offset(ending, span.topic, span.partition, span.end)
        if span.end != TO_END:
            stop = span.end if stop == TO_END else min(stop, span.end)
        if stop != TO_END and stop <= start:
            continue
        ranges.extend(
            split_range(OffsetRange(span.topic, span.partition, start, stop), max_rows_per_range)
        )
    return ranges


def split_range(whole: OffsetRange, max_rows: int) -> list[OffsetRange]:
    """``whole`` cut into consecutive ranges of at most ``max_rows`` (0: not cut)."""
    if max_rows <= 0 or whole.stop == TO_END or whole.rows <= max_rows:
        return [whole]
    return [
        OffsetRange(whole.topic, whole.partition, start, min(start + max_rows, whole.stop))
        for start in range(whole.start, whole.stop, max_rows)
    ]


def segment_ranges(
    topic: str, partition: int, bases: Sequence[int], start: int, stop: int
) -> list[OffsetRange]:
    """``[start, stop)`` of an offline partition cut at its segment boundaries.

    ``bases`` are the segments' base offsets, oldest first; the last segment
    runs to the end of the log, so a range reaching into it is open-ended
    unless ``stop`` bounds it. One range per segment lets Spark read the
    segments of one partition in parallel.
    """
    ranges = []
    for position, base in enumerate(bases):
        segment_end = bases[position + 1] if position + 1 < len(bases) else TO_END
        low = max(base, start)
        if segment_end == TO_END:
            high = stop
        else:
            high = segment_end if stop == TO_END else min(segment_end, stop)
        if high != TO_END and high <= low:
            continue
        ranges.append(OffsetRange(topic, partition, low, high))
    return ranges


@attrs.frozen(slots=True)
class StreamOffsets:
    """A streaming position: the next offset to read of every partition."""

    positions: Mapping[tuple[str, int], int]

    def to_json(self) -> dict[str, dict[str, int]]:
        """The checkpoint form, always built in the same order (see module doc)."""
        table: dict[str, dict[str, int]] = {}
        for topic, partition in sorted(self.positions):
            table.setdefault(topic, {})[str(partition)] = self.positions[topic, partition]
        return table

    @classmethod
    def from_json(cls, table: Mapping[str, Any]) -> StreamOffsets:
        """Parse the checkpoint form; raises OffsetsError if it is not ours."""
        positions = {}
        try:
            for topic, partitions in table.items():
                for partition, offset in partitions.items():
                    positions[str(topic), int(partition)] = int(offset)
        except (AttributeError, TypeError, ValueError) as exc:
            raise OffsetsError(f"not a Broky stream offset: {table!r}") from exc
        return cls(positions)


def initial_offsets(spans: Iterable[PartitionSpan], starting: OffsetSpec) -> StreamOffsets:
    """Where a new query starts: ``starting`` ("earliest", "latest", an int or
    per-partition JSON), clamped to what each partition holds."""
    positions = {}
    for span in spans:
        default = span.end if starting == "latest" else span.start
        offset = spec_offset(starting, span.topic, span.partition, default)
        positions[span.topic, span.partition] = min(max(offset, span.start), span.end)
    return StreamOffsets(positions)


def advance(
    start: StreamOffsets,
    spans: Iterable[PartitionSpan],
    max_rows: int = 0,
    fail_on_data_loss: bool = True,
) -> StreamOffsets:
    """The end of the next micro-batch from ``start``, given what the partitions hold.

    A partition new since ``start`` (a topic created later that matches) is
    first recorded at its start offset and read from the next batch on: its
    range then has a start in the checkpoint, and nothing it holds is skipped. ``max_rows`` (0:
    no limit) is shared out water-filling style: partitions with a small
    backlog take all of it, the rest split what is left evenly, and every
    partition with a backlog gets at least one row while rows remain, so a
    limit never stalls a partition. If retention removed offsets ``start``
    still needs, the batch cannot be exact: raise OffsetsError, or with
    ``fail_on_data_loss=False`` skip to the oldest offset held.
    """
    positions = dict(start.positions)
    backlogs = []
    for span in spans:
        key = (span.topic, span.partition)
        if key not in positions:
            positions[key] = span.start
            continue
        position = positions[key]
        if position < span.start:
            if fail_on_data_loss:
                raise OffsetsError(
                    f"{span.topic}/{span.partition}: offsets {position}..{span.start - 1} were "
                    "deleted by retention before they were read (set failOnDataLoss=false to "
                    "skip them)"
                )
            position = span.start
        positions[key] = position
        if span.end > position:
            backlogs.append((span.end - position, key))
    if max_rows <= 0:
        for backlog, key in backlogs:
            positions[key] += backlog
        return StreamOffsets(positions)
    remaining = max_rows
    backlogs.sort()
    for index, (backlog, key) in enumerate(backlogs):
        if remaining <= 0:
            break
        share = max(remaining // (len(backlogs) - index), 1)
        take = min(backlog, share)
        positions[key] += take
        remaining -= take
    return StreamOffsets(positions)


def stream_ranges(
    start: StreamOffsets, end: StreamOffsets, max_rows_per_range: int = 0
) -> list[OffsetRange]:
    """The ranges of the micro-batch ``[start, end)``, one or more per partition
    that moved; a partition missing from ``start`` is being recorded (see
    ``advance``) and has no range yet."""
    ranges = []
    for (topic, partition), stop in sorted(end.positions.items()):
        begin = start.positions.get((topic, partition), stop)
        if stop > begin:
            ranges.extend(
                split_range(OffsetRange(topic, partition, begin, stop), max_rows_per_range)
            )
    return ranges
