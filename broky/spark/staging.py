"""The sink's files: rows staged by tasks, and the driver's record of commits.

Layout under the staging directory (one per streaming query: it defaults to
``<checkpointLocation>/broky-sink``; one per batch write job)::

    sink-id                    random id of this sink, made once (row uids)
    batch-<id>/<p>-<a>.arrow   rows staged by task attempt <a> of partition <p>
    pending/<id>.json          the publish plan of batch <id>, written before
                               its first message is published
    committed/<id>.json        batch <id> is published; written after the
                               last ack

Every record file is written to a temporary name and renamed, so a reader
sees all of it or none. The directory must be shared by the driver and every
executor (local disk in local mode, a shared file system on a cluster).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import attrs
import pyarrow as pa
import pyarrow.ipc

#: Committed-batch records kept behind the newest: Spark replays at most the
#: batches after its last checkpoint commit, and keeps 100 batches of
#: metadata by default (``spark.sql.streaming.minBatchesToRetain``).
COMMITS_KEPT: Final = 100


@attrs.frozen
class StagedFile:
    """What a task returns to the driver: one file of staged rows."""

    path: str
    rows: int


@attrs.frozen
class PublishPlan:
    """What one batch publishes, fixed before its first message goes out.

    ``files`` are the staged files, in publish order; ``ends`` is where every
    durable partition ended before publishing began, so that a resumed
    commit knows where to look for what already landed.
    """

    files: tuple[str, ...]
    ends: Mapping[str, Mapping[str, int]]


def write_json(path: str, value: Any) -> None:
    """Write ``value`` as JSON at ``path`` atomically (temp file, fsync, rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(value, file, sort_keys=True)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def read_json(path: str) -> Any:
    """The JSON at ``path``, or None if there is no such file."""
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        return None


@attrs.frozen
class StagingArea:
    """One sink's staging directory (see the module doc)."""

    root: str

    def sink_id(self) -> str:
        """This sink's id, made on first use; it survives restarts because it
        lives beside the staged data."""
        path = os.path.join(self.root, "sink-id")
        existing = read_json(path)
        if existing is None:
            os.makedirs(self.root, exist_ok=True)
            candidate = os.path.join(self.root, f"sink-id.{uuid.uuid4().hex}.tmp")
            with open(candidate, "w", encoding="utf-8") as file:
                json.dump(uuid.uuid4().hex, file)
            with contextlib.suppress(FileExistsError):
                os.link(candidate, path)  # the first sink to get here wins
            os.unlink(candidate)
            existing = read_json(path)
        return str(existing)

    def batch_dir(self, batch_id: int) -> str:
        """Where tasks stage the rows of batch ``batch_id``."""
        return os.path.join(self.root, f"batch-{batch_id}")

    def stage(
        self, batch_id: int, partition: int, attempt: int, batches: Iterable[pa.RecordBatch]
    ) -> StagedFile:
        """Write one task's rows to a file of their own; returns its commit message."""
        directory = self.batch_dir(batch_id)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{partition}-{attempt}.arrow")
        temporary = f"{path}.tmp"
        rows = 0
        writer: pyarrow.ipc.RecordBatchFileWriter | None = None
        try:
            for batch in batches:
                if writer is None:
                    writer = pyarrow.ipc.new_file(temporary, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            return StagedFile("", 0)
        os.replace(temporary, path)
        return StagedFile(path, rows)

    def committed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` was published in full."""
        return os.path.exists(self._committed_path(batch_id))

    def pending(self, batch_id: int) -> PublishPlan | None:
        """The plan of a batch whose publishing began and did not finish."""
        record = read_json(self._pending_path(batch_id))
        if record is None:
            return None
        return PublishPlan(tuple(record["files"]), record["ends"])

    def begin(self, batch_id: int, plan: PublishPlan) -> None:
        """Record ``plan`` before publishing anything of batch ``batch_id``."""
        write_json(self._pending_path(batch_id), {"files": list(plan.files), "ends": plan.ends})

    def finish(self, batch_id: int, rows: int) -> None:
        """Record batch ``batch_id`` as published, then drop its staged data
        and the records of batches too old to be replayed."""
        write_json(self._committed_path(batch_id), {"rows": rows})
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._pending_path(batch_id))
        shutil.rmtree(self.batch_dir(batch_id), ignore_errors=True)
        directory = os.path.dirname(self._committed_path(batch_id))
        for name in os.listdir(directory):
            stem = name.removesuffix(".json")
            if stem.isdigit() and int(stem) < batch_id - COMMITS_KEPT:
                os.unlink(os.path.join(directory, name))

    def remove(self) -> None:
        """Delete the whole staging directory (a one-off batch write is done)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def discard(self, batch_id: int) -> None:
        """Drop what tasks staged for ``batch_id``, keeping the files a pending
        plan still needs (an earlier attempt's commit that did not finish)."""
        plan = self.pending(batch_id)
        keep = set(plan.files) if plan is not None else set()
        directory = self.batch_dir(batch_id)
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if path not in keep:
                    os.unlink(path)

    def _pending_path(self, batch_id: int) -> str:
        return os.path.join(self.root, "pending", f"{batch_id}.json")

    def _committed_path(self, batch_id: int) -> str:
        return os.path.join(self.root, "committed", f"{batch_id}.json")


def read_staged(path: str) -> Iterator[pa.RecordBatch]:
    """The batches of one staged file, in the order they were staged."""
    with pa.memory_map(path) as source:
        reader = pyarrow.ipc.open_file(source)
        for index in range(reader.num_record_batches):
            yield reader.get_batch(index)
