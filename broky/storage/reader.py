"""Read a data directory offline: no broker, no recovery, no writes.

For tools and the Spark connector. It reads ``.log`` files only (indexes are
an optimisation of the broker's), verifies every batch's CRC32C, and may run
while a broker appends: a batch still being written at the end of the last
segment is simply not there yet. It never truncates or rewrites anything.

Layout: ``<data dir>/<topic>/<partition>/<base offset>.log``, the partition a
decimal number; ``docs/storage.md`` has the byte layout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import attrs

from broky.storage.batch import StoredBatch
from broky.storage.batch_reading import RecordBatch
from broky.storage.errors import CorruptRecordError
from broky.storage.segment import LOG_SUFFIX, parse_stem, segment_stem
from broky.storage.segment_scan import verified_batches


@attrs.frozen(slots=True)
class PartitionFiles:
    """One partition directory and its segments' base offsets, oldest first."""

    topic: str
    partition: int
    directory: str
    bases: tuple[int, ...]


@attrs.frozen(slots=True)
class Record:
    """One stored message with its coordinates; ``message`` is its FlatBuffer
    (root type ``Message``), exactly as it travelled on the wire."""

    topic: str
    partition: int
    offset: int
    key: bytes
    ts_broker: int
    log_time: int
    message: memoryview


def partition_files(directory: str, topic: str = "", partition: int = 0) -> PartitionFiles:
    """The segments of one partition directory."""
    names = os.listdir(directory)
    bases = sorted(b for b in (parse_stem(name, LOG_SUFFIX) for name in names) if b is not None)
    return PartitionFiles(topic, partition, directory, tuple(bases))


def list_partitions(data_dir: str) -> list[PartitionFiles]:
    """Every ``<topic>/<partition>`` under ``data_dir``, sorted."""
    found = []
    for topic in sorted(os.listdir(data_dir)):
        topic_dir = os.path.join(data_dir, topic)
        if not os.path.isdir(topic_dir):
            continue
        for name in os.listdir(topic_dir):
            directory = os.path.join(topic_dir, name)
            if name.isdigit() and os.path.isdir(directory):
                found.append(partition_files(directory, topic, int(name)))
    return sorted(found, key=lambda files: (files.topic, files.partition))


def iter_record_batches(files: PartitionFiles, from_offset: int = 0) -> Iterator[RecordBatch]:
    """Verified on-disk batches of a partition, from the one holding ``from_offset``.

    Whole batches, for columnar readers: the first may start before
    ``from_offset``. A bad batch at the end of the last segment is a write
    in progress or a torn tail the broker will truncate: iteration ends
    there. A bad batch anywhere else is damage and raises CorruptRecordError.
    """
    for position, base in enumerate(files.bases):
        last_segment = position == len(files.bases) - 1
        if not last_segment and files.bases[position + 1] <= from_offset:
            continue
        path = os.path.join(files.directory, segment_stem(base) + LOG_SUFFIX)
        fd = os.open(path, os.O_RDONLY)
        try:
            for byte, batch in verified_batches(fd, os.fstat(fd).st_size):
                if isinstance(batch, str):
                    if last_segment:
                        return
                    raise CorruptRecordError(f"corrupt batch: {batch}", path, byte)
                if batch.next_offset > from_offset:
                    yield batch
        finally:
            os.close(fd)


def iter_batches(files: PartitionFiles, from_offset: int = 0) -> Iterator[StoredBatch]:
    """The runs of a partition from ``from_offset`` (the first sliced to
    start there), verified as :func:`iter_record_batches` says."""
    for batch in iter_record_batches(files, from_offset):
        yield from batch.runs(from_offset)


def iter_records(data_dir: str, topic: str | None = None) -> Iterator[Record]:
    """Every stored message under ``data_dir`` (or one topic), partition by
    partition, in offset order within each."""
    for files in list_partitions(data_dir):
        if topic is not None and files.topic != topic:
            continue
        for batch in iter_batches(files):
            for offset, message in batch.records():
                yield Record(
                    files.topic,
                    files.partition,
                    offset,
                    batch.key,
                    batch.ts_broker,
                    batch.log_time,
                    message,
                )
