"""Which of a partition's oldest segments retention deletes (pure).

``PartitionLog.enforce_retention`` asks this and does the deleting; the rule
lives here so that it reads, and is tested, without files.
"""

from __future__ import annotations

from collections.abc import Sequence


def expired_prefix(
    sizes: Sequence[int],
    last_times: Sequence[int],
    now: int,
    age_ns: int | None,
    limit_bytes: int | None,
) -> int:
    """How many of the oldest segments to delete, given each segment's size
    and newest batch time (oldest first, the active segment last).

    By age: a segment goes when its newest batch is older than ``age_ns``.
    By bytes: the oldest go while the partition holds more than
    ``limit_bytes``. The last (active) segment never goes: deleting it would
    leave nothing to append to, so a partition keeps at most
    ``max(limit_bytes, active segment)`` bytes. Deletion stops at the first
    segment neither rule removes, so what is left stays contiguous.
    """
    total = sum(sizes)
    deleted = 0
    while deleted < len(sizes) - 1:
        expired = age_ns is not None and last_times[deleted] < now - age_ns
        oversize = limit_bytes is not None and total > limit_bytes
        if not (expired or oversize):
            break
        total -= sizes[deleted]
        deleted += 1
    return deleted
