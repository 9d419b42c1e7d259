"""Where an append's runs split into record batches (pure).

``PartitionLog.append`` encodes the batches this chooses; the rule lives
here so that it reads, and is tested, without a log.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Final

from broky.storage.batch import BATCH_HEADER_BYTES

#: Bytes of runs one batch takes before the next batch starts. Large enough
#: that a batch's fixed costs (header, CRC call, index entry, a reader's
#: decode setup) vanish per message; small enough that a read from the
#: middle of a batch (a replay position, ``last``) verifies little it does
#: not return, and that a batch stays within one read window.
BATCH_TARGET_BYTES: Final = 256 * 1024
#: A record batch's bytes besides its runs: the header and at most three paddings.
BATCH_OVERHEAD: Final = BATCH_HEADER_BYTES + 3 * 7


def batch_bounds(ends: Sequence[int], filled: int, segment_bytes: int) -> list[tuple[int, int]]:
    """The batches of runs whose stored sizes have running totals ``ends``
    (``broky.storage.batch.stored_byte_ends``), as index ranges ``[start,
    stop)``, appended to an active segment already ``filled`` bytes full.

    A batch stays under ``BATCH_TARGET_BYTES`` and inside what is left of
    its segment (a run too big for either gets a batch of its own; where a
    segment fills, the next batch starts a new one, as the log rolls).
    Found by binary search over ``ends``: one step per batch, not per run.
    """
    target = min(BATCH_TARGET_BYTES, segment_bytes)
    bounds = []
    start = 0
    before = 0  # the running total before run ``start``
    while start < len(ends):
        room = min(target, segment_bytes - filled) - BATCH_OVERHEAD
        stop = max(bisect_right(ends, before + room, start), start + 1)
        if stop == start + 1 and filled and ends[start] - before > room:
            filled = 0  # a run that fits no more here starts a segment
            continue
        bounds.append((start, stop))
        size = BATCH_OVERHEAD + ends[stop - 1] - before
        filled += size
        if filled + BATCH_OVERHEAD >= segment_bytes:
            filled = 0  # the next batch starts a segment
        before = ends[stop - 1]
        start = stop
    return bounds
