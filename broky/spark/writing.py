"""Spark's write side: tasks stage rows, the driver publishes them on commit.

``df.write.format("broky")`` and ``df.writeStream.format("broky")`` take
rows with a ``payload`` column (binary or string), a ``key`` column (string;
or option ``key`` for every row) and optional ``key_partition`` (binary or
string) and ``tags`` (map<string,string>) columns; other columns are
ignored. See ``publishing.py`` for the exactly-once-on-commit protocol.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from broky.spark.options import BrokyOptionError, WriteOptions
from broky.spark.publishing import Committer
from broky.spark.staging import StagedFile, StagingArea

#: Spark's types each sink column accepts, and how the error names them.
_ACCEPTED: Final[dict[str, tuple[tuple[type, ...], str]]] = {
    "key": ((StringType,), "string"),
    "payload": ((BinaryType, StringType), "binary or string"),
    "key_partition": ((BinaryType, StringType), "binary or string"),
    "tags": ((MapType,), "map<string,string>"),
}


class StagedCommit(WriterCommitMessage):
    """A task's commit message: the file it staged (picklable)."""

    def __init__(self, staged: StagedFile) -> None:
        self.staged = staged


def check_schema(schema: StructType, options: WriteOptions) -> None:
    """Refuse, on the driver, a DataFrame the sink cannot publish."""
    fields = {field.name: field for field in schema.fields}
    if "payload" not in fields:
        raise BrokyOptionError("writing to Broky needs a payload column (binary or string)")
    if "key" not in fields and options.default_key is None:
        raise BrokyOptionError("writing to Broky needs a key column (string) or option key")
    for name, (accepted, described) in _ACCEPTED.items():
        field = fields.get(name)
        if field is not None and not isinstance(field.dataType, accepted):
            raise BrokyOptionError(
                f"column {name} is {field.dataType.simpleString()}; the sink accepts {described}"
            )


def sink_batch(batch: pa.RecordBatch, default_key: str | None) -> pa.RecordBatch:
    """The sink's columns of one input batch: key, payload, key_partition, tags."""
    names = batch.schema.names
    rows = batch.num_rows
    if "key" in names:
        key = batch.column("key")
        if default_key is not None:
            key = pc.fill_null(key, default_key)
        elif key.null_count:
            raise ValueError("a row has a null key and option key gives no default")
    else:
        key = pa.array([default_key] * rows, pa.string())
    payload = pc.fill_null(batch.column("payload").cast(pa.binary()), b"")
    columns = {"key": key, "payload": payload}
    if "key_partition" in names:
        columns["key_partition"] = batch.column("key_partition").cast(pa.binary())
    if "tags" in names:
        columns["tags"] = batch.column("tags")
    return pa.RecordBatch.from_pydict(columns)


def _stage(
    staging: StagingArea, batch_id: int, default_key: str | None, batches: Iterator[pa.RecordBatch]
) -> StagedCommit:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    attempt = context.taskAttemptId() if context is not None else 0
    converted = (sink_batch(batch, default_key) for batch in batches)
    return StagedCommit(staging.stage(batch_id, partition, attempt, converted))


def _staged(messages: list[WriterCommitMessage | None]) -> list[StagedFile | None]:
    return [message.staged if isinstance(message, StagedCommit) else None for message in messages]


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("broky")``: one job is one batch, published on commit.

    With option ``batchId`` (and ``stagingLocation``) the job is batch
    ``batchId`` of that staging directory, so a ``foreachBatch`` function
    that Spark replays after a failure publishes its batch once.
    """

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        if options.batch_id is None:
            # A write of its own: a fresh directory, batch 0.
            self.staging = StagingArea(f"{options.staging_dir}/write-{uuid.uuid4().hex}")
            self.batch_id = 0
        else:
            self.staging = StagingArea(options.staging_dir)
            self.batch_id = options.batch_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedCommit:
        """Runs in a task: stage the rows; publishes nothing."""
        return _stage(self.staging, self.batch_id, self.options.default_key, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver: publish everything staged, acked (once per batch id)."""
        Committer(self.options.broker, self.staging).commit(self.batch_id, _staged(messages))
        self._forget()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver: a task failed; drop what was staged, publish nothing."""
        Committer(self.options.broker, self.staging).abort(self.batch_id)
        self._forget()

    def _forget(self) -> None:
        """A one-off write's staging directory has nothing left worth keeping."""
        if self.options.batch_id is None:
            self.staging.remove()


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("broky")``: each micro-batch is published once,
    on commit, even when Spark replays it (see ``publishing.py``)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.staging = StagingArea(options.staging_dir)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedCommit:
        """Runs in a task: stage the rows under this micro-batch's id. Spark
        passes the id only as the task's local property."""
        context = TaskContext.get()
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        if batch_id is None:
            raise RuntimeError("a Broky stream writer task ran without a micro-batch id")
        return _stage(self.staging, int(batch_id), self.options.default_key, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: publish micro-batch ``batchId`` unless it already was."""
        Committer(self.options.broker, self.staging).commit(batchId, _staged(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: a task failed; drop what this attempt staged, publish nothing."""
        Committer(self.options.broker, self.staging).abort(batchId)
