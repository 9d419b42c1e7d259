"""Where a read gets its messages: a data directory or a running broker.

Both sides answer the same two questions: which partitions exist (and what
they hold), and the Arrow batches of one offset range. The planning
(``planning.py``) happens on Spark's driver; ``read_range`` runs in a
Spark task, so everything it needs travels in the pickled ``LogAccess``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, TypeVar

import attrs
import pyarrow as pa
import trio

from broky.client.client import Client
from broky.client.durable import PartitionInfo
from broky.client.errors import BrokyError
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Run
from broky.spark.columns import RunColumns, record_batches, slice_run
from broky.spark.options import BrokerEndpoint
from broky.spark.planning import (
    TO_END,
    OffsetRange,
    OffsetSpec,
    PartitionSpan,
    TopicSelection,
    batch_ranges,
    segment_ranges,
    spec_offset,
)
from broky.storage.reader import iter_record_batches, list_partitions, partition_files

#: Fetch answers a reader thread may hold before the decoder catches up:
#: bounds a task's memory to a few fetches of ``fetch_bytes`` each.
PREFETCH: Final = 4
#: Seconds a broker request may take before a Spark task gives up on it.
REQUEST_TIMEOUT: Final = 30.0

T = TypeVar("T")


class NotDurableError(ValueError):
    """A stream was asked for topics the broker does not store."""


def run_client(
    broker: BrokerEndpoint,
    work: Callable[[Client], Awaitable[T]],
    timeout: float | None = REQUEST_TIMEOUT,
) -> T:
    """Run ``work`` against a fresh connection to ``broker``, from sync code
    (Spark calls the connector from plain threads); ``timeout`` bounds the
    whole of it (None: ``work`` bounds its own steps)."""

    async def main() -> T:
        with trio.fail_after(timeout) if timeout is not None else contextlib.nullcontext():
            async with broker.connect("broky-spark") as client:
                return await work(client)

    try:
        return trio.run(main)
    except BaseExceptionGroup as group:
        # The client's nursery wraps errors in groups; Spark shows the
        # caller the one error that happened, not the nesting.
        single = _single(group)
        if single is None:
            raise
        raise single from None


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The only leaf exception of nested one-member groups, if that is what it is."""
    while len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return None


@attrs.frozen
class DataDirLog:
    """A data directory read offline (``broky/storage/reader.py``): one range
    per segment, so one partition's segments are read in parallel."""

    data_dir: str

    def ranges(
        self, selection: TopicSelection, starting: OffsetSpec, ending: OffsetSpec
    ) -> list[OffsetRange]:
        """The ranges of a batch read (the active segment's end is not known
        ahead: its range runs to whatever is there when the task reads)."""
        ranges = []
        for files in list_partitions(self.data_dir):
            if not files.bases or not selection.selected(files.topic, files.partition):
                continue
            start = spec_offset(starting, files.topic, files.partition, files.bases[0])
            stop = spec_offset(ending, files.topic, files.partition, TO_END)
            ranges.extend(segment_ranges(files.topic, files.partition, files.bases, start, stop))
        return ranges

    def read_range(
        self, work: OffsetRange, time_range: tuple[int, int] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one range, CRC-checked as they are read."""
        directory = os.path.join(self.data_dir, work.topic, str(work.partition))
        files = partition_files(directory, work.topic, work.partition)

        def runs() -> Iterator[Run | RunColumns]:
            stop = None if work.stop == TO_END else work.stop
            for batch in iter_record_batches(files, work.start):
                if stop is not None and batch.base_offset >= stop:
                    return
                inside = batch.base_offset >= work.start and (
                    stop is None or batch.next_offset <= stop
                )
                if inside and time_range is None:
                    yield RunColumns.of_batch(batch)  # the usual case: no step per run
                    continue
                for stored in batch.runs(work.start, stop):
                    yield Run(
                        stored.key,
                        stored.ts_broker,
                        stored.count,
                        stored.sizes,
                        stored.messages,
                        work.partition,
                        stored.base_offset,
                    )

        return record_batches(work.topic, work.partition, runs(), time_range)


@attrs.frozen
class BrokerLog:
    """A running broker, read through ListPartitions and Fetch."""

    broker: BrokerEndpoint
    fetch_bytes: int

    def spans(self, selection: TopicSelection) -> list[PartitionSpan]:
        """What every selected durable partition holds now."""
        infos: list[PartitionInfo] = run_client(self.broker, lambda client: client.partitions(""))
        return [
            PartitionSpan(info.topic, info.partition, info.start_offset, info.end_offset)
            for info in infos
            if selection.selected(info.topic, info.partition)
        ]

    def durable_spans(self, selection: TopicSelection) -> list[PartitionSpan]:
        """``spans``, refusing a selection that names a topic the broker does
        not store: ephemeral messages cannot be replayed, so a stream over
        them would lose data on every restart."""
        spans = self.spans(selection)
        found = {span.topic for span in spans}
        missing = sorted(selection.names - found)
        if missing or not spans:
            every = run_client(self.broker, lambda client: client.partitions(""))
            durable = sorted({info.topic for info in every})
            raise NotDurableError(
                f"{', '.join(missing) or 'the selected topics'}: no such durable topic on "
                f"{self.broker} (durable topics: {', '.join(durable) or 'none'}). A stream "
                "reads durable topics only, by their [[durable]] name: ephemeral keys are not "
                "stored, so they could not be replayed after a failure."
            )
        return spans

    def ranges(
        self,
        selection: TopicSelection,
        starting: OffsetSpec,
        ending: OffsetSpec,
        max_rows_per_range: int,
    ) -> list[OffsetRange]:
        """The ranges of a batch read: up to what each partition holds now."""
        return batch_ranges(self.spans(selection), starting, ending, max_rows_per_range)

    def read_range(
        self, work: OffsetRange, time_range: tuple[int, int] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one range; a thread fetches ahead while this one decodes."""
        return record_batches(work.topic, work.partition, self._runs(work), time_range)

    def _runs(self, work: OffsetRange) -> Iterator[Run]:
        answers: queue.Queue[tuple[Run, ...] | BaseException | None] = queue.Queue(PREFETCH)
        stopping = threading.Event()

        def put(item: tuple[Run, ...] | BaseException | None) -> bool:
            while not stopping.is_set():
                with contextlib.suppress(queue.Full):
                    answers.put(item, timeout=0.1)
                    return True
            return False

        async def fetch_all(client: Client) -> None:
            offset = work.start
            while offset < work.stop and not stopping.is_set():
                with trio.fail_after(REQUEST_TIMEOUT):
                    runs = await client.fetch_runs(
                        work.topic, work.partition, offset, self.fetch_bytes
                    )
                if not runs:
                    raise BrokyError(
                        ErrorCode.OFFSET_OUT_OF_RANGE,
                        f"{work.topic}/{work.partition} ended at {offset}, before {work.stop}",
                    )
                runs = tuple(slice_run(run, offset, work.stop) for run in runs)
                offset = runs[-1].base_offset + runs[-1].count
                if not await trio.to_thread.run_sync(put, runs):
                    return

        def fetcher() -> None:
            try:
                run_client(self.broker, fetch_all, timeout=None)
                put(None)
            except BaseException as exc:  # handed to the consuming task
                put(exc)

        thread = threading.Thread(target=fetcher, name="broky-fetch", daemon=True)
        thread.start()
        try:
            while True:
                item = answers.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield from item
        finally:
            stopping.set()
            thread.join()
