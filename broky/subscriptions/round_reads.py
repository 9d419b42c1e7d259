"""The log reads of a partition's subscription rounds (run by the
partition's owner, in its thread) and the bounds that size them.

Apart from the round (broky.subscriptions.partition) because these touch
the log and nothing of the dispatchers: the round asks, the owner runs them.
"""

from __future__ import annotations

from typing import Final

from broky.storage.batch_reading import BatchSpan
from broky.storage.errors import OffsetOutOfRangeError
from broky.storage.log import PartitionLog

#: Bytes of stored batches one round reads per dispatcher: bounds a round's
#: memory (and its thread hop) whatever the credit granted.
READ_BYTES: Final = 1024 * 1024
#: Bytes of stored batches kept from one round for the next ones, while a
#: dispatcher holds messages back (parked for a consumer out of credit):
#: those are delivered later from the kept batches, not read again. Per
#: partition; nothing is kept while nothing waits.
KEEP_BYTES: Final = 4 * READ_BYTES
#: Bytes of kept batches over all of one worker's partitions (``KeptBudget``):
#: many partitions each holding messages back for a slow consumer keep at
#: most this much between them, not ``KEEP_BYTES`` each.
KEEP_BUDGET: Final = 16 * KEEP_BYTES
#: Offsets to deliver that are missing from a round's reads (parked, due
#: again) and at most this far apart are read as one span: one window fill
#: instead of one per offset (key-shared over many keys parks offsets spread
#: all over the log).
READ_GAP: Final = 4096


def read_new(
    partition_log: PartitionLog, wanted: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, list[BatchSpan]]]:
    """In the owner's thread: each dispatcher's next ``count`` offsets from
    its read position, with the log's start (retention may have moved it
    past the position: then the read begins there)."""
    reads: dict[str, tuple[int, list[BatchSpan]]] = {}
    log_start = partition_log.start_offset
    for name, (position, count) in wanted.items():
        start = max(position, log_start)
        stop = position + count
        reads[name] = (
            log_start,
            partition_log.read_spans(start, READ_BYTES, stop) if start < stop else [],
        )
    return reads


def read_ranges(partition_log: PartitionLog, ranges: list[tuple[int, int]]) -> list[BatchSpan]:
    """In the owner's thread: the batches holding ``[first, stop)`` ranges
    (what retention removed is left out)."""
    batches: list[BatchSpan] = []
    for first, stop in ranges:
        position = max(first, partition_log.start_offset)
        while position < stop:
            try:
                found = partition_log.read_spans(position, READ_BYTES, stop)
            except OffsetOutOfRangeError:
                break
            if not found:
                break
            batches.extend(found)
            position = found[-1].next_offset
    return batches


class KeptBudget:
    """The bytes of kept batches each partition of one worker holds (one
    per subscription service, used from its trio thread): a partition may
    keep ``KEEP_BYTES`` while the worker's total stays within ``total``;
    what it may not keep is read again when delivered, as before batches
    were kept."""

    __slots__ = ("_held", "total", "used")

    def __init__(self, total: int = KEEP_BUDGET) -> None:
        self.total = total
        self.used = 0
        self._held: dict[tuple[str, int], int] = {}

    def allowance(self, partition: tuple[str, int]) -> int:
        """Bytes ``partition`` may keep now: its own share counts as free."""
        free = self.total - self.used + self._held.get(partition, 0)
        return max(0, min(KEEP_BYTES, free))

    def hold(self, partition: tuple[str, int], nbytes: int) -> None:
        """``partition`` now keeps ``nbytes`` (0: nothing)."""
        self.used += nbytes - self._held.pop(partition, 0)
        if nbytes:
            self._held[partition] = nbytes
