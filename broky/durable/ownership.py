"""Which worker of a node owns each partition of a durable topic, and the
lock that makes that ownership exclusive on disk.

The rule: ``owner(topic, p) = (xxh3_64(topic name) + p) mod workers``.
Consecutive partitions of one topic land on consecutive workers (a topic
with as many partitions as workers uses them all), and the topic's hash
picks where that run of workers starts, so many single-partition topics
spread over the workers instead of all landing on worker 0 (what ``p mod
workers`` would do). Every worker computes it from the configuration alone:
no coordination, and every node of a cluster (same worker count) agrees on
the owner *index* of each partition. Changing the number of workers moves
partitions between workers; their logs stay where they are (one directory
per partition under ``data_dir``), so a restart with another count just
opens them in other processes.

Only the owner opens a partition's directory, and it holds an exclusive
``flock`` on ``<partition dir>/.lock`` while it does (Kafka guards its log
directories the same way): a second process that tries (a restart racing
the old process's exit, a misconfigured second broker on the same
``data_dir``) gets a clear error instead of two appenders on one log. The
kernel releases the lock when the process dies, even by SIGKILL.
"""

from __future__ import annotations

import fcntl
import os
from typing import Final

import xxhash

from broky.storage.errors import StorageError

#: The lock file's name inside a partition directory (ignored by the log,
#: which only reads its segment and index files).
LOCK_FILE: Final = ".lock"


def partition_owner(topic: str, partition: int, workers: int) -> int:
    """The index of the worker that owns ``partition`` of ``topic`` among ``workers``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return (xxhash.xxh3_64_intdigest(topic.encode()) + partition) % workers


class PartitionLock:
    """An exclusive, non-blocking ``flock`` on one partition directory."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, LOCK_FILE)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise StorageError(
                f"{directory} is locked by another process: another worker or broker "
                "serves this partition (is a second broker using the same data_dir?)"
            ) from None

    def release(self) -> None:
        """Give the lock up (closing the descriptor drops it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
