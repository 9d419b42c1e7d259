"""Batching a consumer's acks, nacks, terms and in-progress signals into
``Settle`` frames of offset ranges (sans-IO: offsets in, frames out).

The wire never carries one frame per message (docs/protocol.md, ``Settle``):
an application acks message by message, and this module folds those acks
into inclusive ``[first, last]`` ranges per (topic, partition), one frame per
topic and kind, until the consumer flushes them on a short timer, when a
batch is big enough, or on close. Acks of one partition usually arrive in
offset order, so the common case extends the last range in O(1); acks out of
order (a shared consumer finishing work unevenly) merge by bisection.

Every frame asks for a receipt (a non-zero ``sequence``): ``Settled`` comes
back once the broker's group commit holds the change, and
``Consumer.flush`` waits for the receipts of everything sent before it.
Receipts cost one small frame per batch, never one per message.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from typing import Final

from broky.protocol.constants import SettleKind
from broky.protocol.frames import Settle

#: Ranges per Settle frame: 20 bytes each on the wire (partition, first,
#: last), so 2,048 ranges stay under 42 KiB, inside the smallest frame limit
#: a broker may announce (64 KiB) with room for the topic and reason.
MAX_RANGES_PER_FRAME: Final = 2048


class RangeSet:
    """Offsets of one (topic, partition) as sorted, disjoint, maximal
    inclusive ranges: ``add(5); add(6); add(8)`` holds ``[(5, 6), (8, 8)]``.

    Adding an offset already held changes nothing (an application that acks
    twice sends one ack).
    """

    __slots__ = ("_firsts", "_lasts")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    def add(self, offset: int) -> None:
        """Hold ``offset``."""
        self.add_range(offset, offset)

    def add_range(self, first: int, last: int) -> None:
        """Hold every offset of ``[first, last]`` (``first <= last``); O(1)
        when it extends the highest range or lies above it, else merges
        the ranges it touches (found by bisection)."""
        firsts, lasts = self._firsts, self._lasts
        if not lasts or first > lasts[-1] + 1:
            firsts.append(first)
            lasts.append(last)
            return
        if first >= firsts[-1]:
            lasts[-1] = max(lasts[-1], last)
            return
        # Ranges [low, high) touch [first, last]: each ends at or after
        # first - 1 and starts at or before last + 1.
        low = bisect.bisect_left(lasts, first - 1)
        high = bisect.bisect_right(firsts, last + 1)
        if low == high:
            firsts.insert(low, first)
            lasts.insert(low, last)
            return
        firsts[low:high] = [min(first, firsts[low])]
        lasts[low:high] = [max(last, lasts[high - 1])]

    def add_ranges(self, firsts: list[int], lasts: list[int], ascending: bool) -> None:
        """Hold every offset of each ``[firsts[i], lasts[i]]``. ``ascending``
        (each range starts above the one before it plus one) and the first
        above the highest held plus one: appended whole, the common case of
        a consumer acking its batches in delivery order; else range by
        range."""
        held_lasts = self._lasts
        if ascending and firsts and (not held_lasts or firsts[0] > held_lasts[-1] + 1):
            self._firsts += firsts
            held_lasts += lasts
            return
        for first, last in zip(firsts, lasts, strict=True):
            self.add_range(first, last)

    def columns(self) -> tuple[list[int], list[int]]:
        """The held ranges' firsts and lasts, lowest first (the lists held:
        for a caller about to drop this set)."""
        return self._firsts, self._lasts

    def ranges(self) -> list[tuple[int, int]]:
        """The held ranges, lowest first."""
        return list(zip(self._firsts, self._lasts, strict=True))

    def __len__(self) -> int:
        """How many ranges (not offsets) are held."""
        return len(self._firsts)


#: A batch's offsets of one (topic, partition) as ranges: (topic,
#: partition, firsts, lasts, ascending), ``broky.client.delivery.settle_ranges``.
FoldedRanges = tuple[str, int, list[int], list[int], bool]
#: What one Settle frame has in common: kind, topic, delay and reason (a
#: plain tuple: it is built and hashed once per settled message).
_Group = tuple[SettleKind, str, int, str]


class SettleBatcher:
    """Pending settles of one consumer stream, folded into ranges.

    ``add`` records one message's outcome and says whether the batch has
    reached ``max_offsets`` (the caller then sends ``take()`` at once instead
    of waiting for its timer). ``take`` drains everything into Settle frames,
    each with the next receipt sequence, in the order their groups first
    appeared (so an in-progress signal sent before an ack stays before it).
    Owned by one consumer; not shared between tasks.
    """

    def __init__(self, stream: int, max_offsets: int = 1024) -> None:
        if max_offsets < 1:
            raise ValueError(f"max_offsets must be at least 1, got {max_offsets}")
        self.stream = stream
        self.max_offsets = max_offsets
        self._groups: dict[_Group, dict[int, RangeSet]] = {}
        #: The (group, partition) of the last ``add`` and its ranges: a
        #: consumer acks runs of one partition, so most adds hit it.
        self._last: tuple[_Group, int] | None = None
        self._last_ranges = RangeSet()
        self._pending = 0
        self._sequences = itertools.count(1)

    @property
    def pending(self) -> int:
        """Outcomes recorded since the last ``take`` (duplicates included)."""
        return self._pending

    def add(
        self,
        kind: SettleKind,
        topic: str,
        partition: int,
        offset: int,
        delay_ms: int = -1,
        reason: str = "",
    ) -> bool:
        """Record one message's outcome; True once the batch should be sent now."""
        return self.add_range(kind, topic, partition, offset, offset, delay_ms, reason)

    def add_range(
        self,
        kind: SettleKind,
        topic: str,
        partition: int,
        first: int,
        last: int,
        delay_ms: int = -1,
        reason: str = "",
    ) -> bool:
        """Record one outcome for each offset of ``[first, last]`` (a batch
        of deliveries folds into a few of these: one call per range, not per
        message); True once the batch should be sent now."""
        ranges = self._ranges((kind, topic, delay_ms, reason), partition)
        ranges.add_range(first, last)
        self._pending += last - first + 1
        return self._pending >= self.max_offsets

    def add_folded(
        self,
        kind: SettleKind,
        folded: list[FoldedRanges],
        outcomes: int,
        delay_ms: int = -1,
        reason: str = "",
    ) -> bool:
        """Record one outcome for each of ``outcomes`` deliveries folded
        into ``folded`` (``settle_ranges``): one call per batch and a list
        splice per partition, where a key-shared consumer's batch is
        mostly ranges of one offset; True once the batch should be sent."""
        for topic, partition, firsts, lasts, ascending in folded:
            self._ranges((kind, topic, delay_ms, reason), partition).add_ranges(
                firsts, lasts, ascending
            )
        self._pending += outcomes
        return self._pending >= self.max_offsets

    def _ranges(self, group: _Group, partition: int) -> RangeSet:
        """The ranges pending for ``group`` in ``partition``."""
        if (group, partition) == self._last:
            return self._last_ranges
        partitions = self._groups.get(group)
        if partitions is None:
            partitions = self._groups[group] = {}
        ranges = partitions.get(partition)
        if ranges is None:
            ranges = partitions[partition] = RangeSet()
        self._last, self._last_ranges = (group, partition), ranges
        return ranges

    def take(self) -> list[Settle]:
        """Everything pending as Settle frames (each asking for a receipt);
        afterwards nothing is pending."""
        frames = [
            frame
            for group, partitions in self._groups.items()
            for frame in self._frames(group, partitions)
        ]
        self._groups = {}
        self._last = None
        self._pending = 0
        return frames

    def _frames(self, group: _Group, partitions: dict[int, RangeSet]) -> Iterator[Settle]:
        kind, topic, delay_ms, reason = group
        numbers: list[int] = []
        firsts: list[int] = []
        lasts: list[int] = []
        for partition in sorted(partitions):
            held_firsts, held_lasts = partitions[partition].columns()
            numbers += itertools.repeat(partition, len(held_firsts))
            firsts += held_firsts
            lasts += held_lasts
        for start in range(0, len(firsts), MAX_RANGES_PER_FRAME):
            stop = start + MAX_RANGES_PER_FRAME
            yield Settle(
                stream=self.stream,
                sequence=next(self._sequences),
                kind=kind,
                partitions=tuple(numbers[start:stop]),
                first_offsets=tuple(firsts[start:stop]),
                last_offsets=tuple(lasts[start:stop]),
                delay_ms=delay_ms,
                reason=reason,
                topic=topic,
            )
