"""Spark's read side: the batch reader and the stream reader.

Both plan offset ranges on the driver and read them in tasks, one Spark
input partition per range (a topic partition, a segment of it, or a slice
of at most ``maxRowsPerPartition`` messages), yielding Arrow batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from broky.spark.logs import BrokerLog, DataDirLog
from broky.spark.options import ReadOptions
from broky.spark.planning import (
    OffsetRange,
    PartitionSpan,
    StreamOffsets,
    advance,
    initial_offsets,
    stream_ranges,
)
from broky.spark.pushdown import Pruning, prune_for


class RangePartition(InputPartition):
    """One offset range: what a Spark task reads."""

    def __init__(self, work: OffsetRange) -> None:
        super().__init__(work)
        self.work = work


def _log(options: ReadOptions) -> DataDirLog | BrokerLog:
    if options.data_dir is not None:
        return DataDirLog(options.data_dir)
    assert options.broker is not None  # ReadOptions.parse guarantees one of them
    return BrokerLog(options.broker, options.fetch_bytes)


class BatchReader(DataSourceReader):
    """``spark.read.format("broky")``: what the log holds when the query is planned."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.log = _log(options)

    def partitions(self) -> Sequence[InputPartition]:
        """One input partition per offset range, in topic/partition/offset order."""
        return [RangePartition(work) for work in self._ranges()]

    def _ranges(self) -> list[OffsetRange]:
        options = self.options
        if isinstance(self.log, DataDirLog):
            return self.log.ranges(options.selection, options.starting, options.ending)
        return self.log.ranges(
            options.selection, options.starting, options.ending, options.rows_per_range
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Runs in a task: the range's messages as Arrow batches."""
        if not isinstance(partition, RangePartition):
            # Spark reads one placeholder partition when ``partitions()``
            # planned none (nothing selected, or nothing new): no rows.
            return iter(())
        return self.log.read_range(partition.work, self.options.time_range)


class FilteringBatchReader(BatchReader):
    """``BatchReader`` with filter pushdown (option ``pushFilters``): plans
    only the ranges and times the query's filters can match.

    A separate class because Spark refuses a reader that defines
    ``pushFilters`` unless ``spark.sql.python.filterPushdown.enabled`` is
    set (off by default): the plain reader must keep working without it.
    """

    def __init__(self, options: ReadOptions) -> None:
        super().__init__(options)
        self.pruning = Pruning()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Prune the plan with ``filters`` and hand *all* of them back as
        still to evaluate: pruning keeps a superset of the matching rows
        (an ``IN`` keeps the span of its values, ``NOT``, ``OR`` and filters
        on other columns are ignored), so Spark must re-check every row and
        the results are those of the query without pushdown. Called on the
        driver, before ``partitions``; the narrowed options travel to
        ``read`` with the pickled reader."""
        self.pruning = prune_for(filters)
        self.options = attrs.evolve(
            self.options, time_range=self.pruning.time_range(self.options.time_range)
        )
        return filters

    def _ranges(self) -> list[OffsetRange]:
        return self.pruning.prune(super()._ranges())


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("broky")`` over a broker's durable topics.

    The checkpointed offset is ``{"topic": {"partition": next offset}}``.
    Broky keeps no state for the query (``commit`` is a no-op: Spark's
    checkpoint is the only record of progress), so restarting from the
    checkpoint re-reads exactly the ranges Spark had not committed.
    """

    def __init__(self, options: ReadOptions) -> None:
        assert options.broker is not None  # ReadOptions.parse(streaming=True) requires it
        self.options = options
        self.log = BrokerLog(options.broker, options.fetch_bytes)
        #: Trigger.AvailableNow: the ends recorded when the query started.
        self.target: StreamOffsets | None = None

    def _spans(self) -> list[PartitionSpan]:
        spans = self.log.durable_spans(self.options.selection)
        if self.target is None:
            return spans
        target = self.target.positions
        return [
            PartitionSpan(
                span.topic,
                span.partition,
                span.start,
                min(span.end, target.get((span.topic, span.partition), span.start)),
            )
            for span in spans
        ]

    def initialOffset(self) -> dict[str, Any]:
        """Where a query without a checkpoint starts (``startingOffsets``,
        latest by default, like Kafka's source). Spark may call this twice
        on a first start; it has no side effects."""
        return initial_offsets(self._spans(), self.options.starting).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRowsPerBatch`` (0: everything available)."""
        if self.options.max_rows_per_batch:
            return ReadMaxRows(self.options.max_rows_per_batch)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The next batch's end: everything past ``start``, within ``limit``."""
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else 0
        end = advance(
            StreamOffsets.from_json(start),
            self._spans(),
            max_rows,
            self.options.fail_on_data_loss,
        )
        return end.to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        """Record every partition's current end: the query stops there."""
        spans = self.log.durable_spans(self.options.selection)
        self.target = StreamOffsets({(span.topic, span.partition): span.end for span in spans})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One input partition per range the batch covers."""
        ranges = stream_ranges(
            StreamOffsets.from_json(start),
            StreamOffsets.from_json(end),
            self.options.rows_per_range,
        )
        return [RangePartition(work) for work in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Runs in a task: the range's messages as Arrow batches."""
        if not isinstance(partition, RangePartition):
            # Spark reads one placeholder partition when ``partitions()``
            # planned none (nothing selected, or nothing new): no rows.
            return iter(())
        return self.log.read_range(partition.work, self.options.time_range)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: see the class doc. (Spark calls this one batch
        late, and not for the last batch before a stop.)"""
