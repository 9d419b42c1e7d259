"""The acked offsets of one (subscription, partition): a cursor and ranges above it (sans-IO).

Below the cursor every offset is acked; above it, the acked offsets are kept
as sorted, disjoint, inclusive ranges (two parallel lists, firsts and lasts),
so a subscription whose consumers ack out of order keeps one entry per gap,
not per offset. Why its own module: the tracker (``tracker.py``) owns one,
and the settle path merges into it in bulk (``ack_pass.merge_acked``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from broky.subscriptions.ack_pass import merge_acked


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
