"""The acked offsets of one (subscription, partition): a cursor and ranges above it (sans-IO).

Below the cursor every offset is acked; above it, the acked offsets are kept
as sorted, disjoint, inclusive ranges (two parallel lists, firsts and lasts),
so a subscription whose consumers ack out of order keeps one entry per gap,
not per offset. Why its own module: the tracker (``tracker.py``) owns one,
and the settle path merges into it in bulk (``ack_pass.merge_acked``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from typing import overload

from broky.subscriptions.ack_pass import merge_acked


class RangePairs(Sequence[tuple[int, int]]):
    """Inclusive ``(first, last)`` ranges kept as the two columns they were
    copied from (``AckedRanges.columns``), read as pairs.

    Why: a key-shared subscription's image holds thousands of scattered
    acked ranges and is taken at every group commit; a tuple per range
    (``ranges``) was built, encoded once and freed each time, where two
    list copies cost a pointer copy a range and the compiled image writer
    (``_passes.put_pairs``) reads the columns. Equal to any sequence of
    the same pairs (an image read back holds a tuple of them)."""

    __slots__ = ("firsts", "lasts")

    def __init__(self, firsts: list[int], lasts: list[int]) -> None:
        if len(firsts) != len(lasts):
            raise ValueError("range columns of different lengths")
        self.firsts = firsts
        self.lasts = lasts

    def __len__(self) -> int:
        return len(self.firsts)

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[tuple[int, int], ...]: ...
    def __getitem__(self, index: int | slice) -> tuple[int, int] | tuple[tuple[int, int], ...]:
        if isinstance(index, slice):
            return tuple(zip(self.firsts[index], self.lasts[index], strict=True))
        return self.firsts[index], self.lasts[index]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.firsts, self.lasts, strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RangePairs):
            return self.firsts == other.firsts and self.lasts == other.lasts
        if isinstance(other, Sequence):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"RangePairs({tuple(self)!r})"


class AckedRanges:
    """A cursor and the sorted, disjoint, inclusive ranges acked above it."""

    def __init__(self, cursor: int, ranges: Sequence[tuple[int, int]] = ()) -> None:
        self.cursor = cursor
        self._firsts: list[int] = []
        self._lasts: list[int] = []
        for given_first, last in sorted(ranges):
            if last < self.cursor:
                continue
            first = max(given_first, self.cursor)
            if first == self.cursor:
                self.cursor = last + 1
            elif self._lasts and first <= self._lasts[-1] + 1:
                self._lasts[-1] = max(self._lasts[-1], last)
            else:
                self._firsts.append(first)
                self._lasts.append(last)

    def __contains__(self, offset: int) -> bool:
        if offset < self.cursor:
            return True
        index = bisect_right(self._firsts, offset) - 1
        return index >= 0 and self._lasts[index] >= offset

    def __len__(self) -> int:
        """The number of ranges above the cursor (what ``max_ack_ranges`` caps)."""
        return len(self._firsts)

    def count_below(self, end: int) -> int:
        """How many offsets of the ranges lie below ``end``. Sums over the
        two lists at C speed, not a step per range: a key-shared
        subscription holds thousands of scattered ranges, and the stall
        watch asks for every partition's backlog each second it sees no
        delivery (the end of a run is such a second)."""
        firsts, lasts = self._firsts, self._lasts
        whole = bisect_right(lasts, end - 1)  # the ranges that end below ``end``
        count = sum(lasts[:whole]) - sum(firsts[:whole]) + whole
        if whole < len(firsts) and firsts[whole] < end:
            count += end - firsts[whole]
        return count

    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self._firsts, self._lasts, strict=True))

    def columns(self) -> RangePairs:
        """The ranges as a copy of the two columns (what an image takes:
        see ``RangePairs``)."""
        return RangePairs(self._firsts[:], self._lasts[:])

    def reaches(self, offset: int) -> bool:
        """Whether a range above the cursor ends at or after ``offset``."""
        return bool(self._lasts) and self._lasts[-1] >= offset

    def add_range(self, first: int, last: int) -> None:
        """Mark ``[first, last]`` acked: one bisection and one splice, however
        long the range (settles carry ranges)."""
        if last < self.cursor:
            return
        first = max(first, self.cursor)
        firsts, lasts = self._firsts, self._lasts
        if first == self.cursor:  # the usual shared case: the cursor moves
            self.cursor = last + 1
            while firsts and firsts[0] <= self.cursor:
                self.cursor = max(self.cursor, lasts[0] + 1)
                del firsts[0], lasts[0]
            return
        if not lasts or first > lasts[-1] + 1:  # above every range
            firsts.append(first)
            lasts.append(last)
            return
        # The ranges touching [first - 1, last + 1] merge with it.
        low = bisect_left(lasts, first - 1)
        high = bisect_right(firsts, last + 1)
        if low < high:
            first = min(first, firsts[low])
            last = max(last, lasts[high - 1])
        firsts[low:high] = [first]
        lasts[low:high] = [last]
        if firsts[0] == self.cursor:
            self.cursor = lasts[0] + 1
            del firsts[0], lasts[0]

    def add(self, offset: int) -> bool:
        """Mark ``offset`` acked; False if it already was."""
        if offset in self:
            return False
        self.add_range(offset, offset)
        return True

    def add_sorted(self, offsets: list[int]) -> None:
        """Mark acked ``offsets``: ascending, distinct and none acked yet
        (offsets still counted as delivered), in one merge pass however
        scattered they are (``ack_pass.merge_acked``)."""
        self.cursor = merge_acked(self._firsts, self._lasts, self.cursor, offsets)
