"""A priority queue of ack timers that costs O(1) when they come in order (sans-IO).

An :class:`~broky.subscriptions.tracker.AckTracker` keeps a timer per
delivery (per message in key-shared and the ordered types) and drops void
ones (the delivery was acked) lazily, when they reach the front. Its
deadlines are ``now + ack_timeout`` with ``now`` from a monotonic clock, so
timers nearly always arrive in order: a binary heap then paid ``log n``
tuple comparisons twice per message (push, and the pop of the void timer
after the ack) for an order that was already there. Here a timer that is
not below the last one queued in order goes to a FIFO (append, popleft); any
other (a caller whose ``now`` went back, a redelivery of a lower offset at
the same instant) goes to a heap, and the front is the smaller of the two
fronts. The pop order is exactly a single heap's: both hold sorted entries
and entries are unique (they carry a sequence number).
"""

from __future__ import annotations

import heapq
from collections import deque

#: A timer: (deadline, first offset, sequence, stop). Numbers only, so the
#: garbage collector untracks it (a timer per pending message holding its
#: delivery made every collection walk them all); the tracker finds a span's
#: delivery by sequence, one offset's in its ``pending``. The sequence keeps
#: entries with equal deadline and offset apart.
Timer = tuple[float, int, int, int]


class TimerQueue:
    """A min-queue of unique timers (see the module docstring)."""

    __slots__ = ("_in_order", "_out_of_order")

    def __init__(self) -> None:
        self._in_order: deque[Timer] = deque()
        self._out_of_order: list[Timer] = []

    def __len__(self) -> int:
        return len(self._in_order) + len(self._out_of_order)

    def push(self, entry: Timer) -> None:
        in_order = self._in_order
        if not in_order or in_order[-1] <= entry:
            in_order.append(entry)
        else:
            heapq.heappush(self._out_of_order, entry)

    def peek(self) -> Timer | None:
        """The smallest entry, or None when empty."""
        in_order, out_of_order = self._in_order, self._out_of_order
        if out_of_order and (not in_order or out_of_order[0] < in_order[0]):
            return out_of_order[0]
        return in_order[0] if in_order else None

    def pop(self) -> Timer:
        """Remove and return the smallest entry; IndexError when empty."""
        in_order, out_of_order = self._in_order, self._out_of_order
        if out_of_order and (not in_order or out_of_order[0] < in_order[0]):
            return heapq.heappop(out_of_order)
        return in_order.popleft()
