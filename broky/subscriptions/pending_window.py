"""An ordered dispatcher's pending deliveries as a window indexed by offset.

``AckTracker.pending`` maps each delivered, unacked offset to its
delivery. A shared subscription keeps it a dict (its acks mostly end whole
spans, ``ack_spans``). An ordered one (key-shared, failover, exclusive)
acks scattered offsets one by one, and a dict of the tens of thousands in
flight made each ack a hash pop with about three cache misses (the index
table, the entry, the key object), and each delivery an insert:
5-8 % of the broker in ``bench_consumers``' key-shared row. Here an
offset's delivery sits at ``entries[offset - base]`` (None where nothing
is pending): a delivery at the read position is an append, an ack an
index store.

Bound: pending offsets lie between the cursor and the read position, which
stops ``max_unacked`` past the cursor, and the front under the cursor is
cut in one slice once ``WINDOW_CUT`` offsets lie there (``trim``): the
list holds at most ``max_unacked + WINDOW_CUT`` pointers (8 bytes each).

The compiled hot paths (``_passes.take_acked``, ``_feed.feed_fresh``) read
and write ``entries`` and ``base`` directly; everything else goes through
the mapping interface, whose answers are those of the dict it replaces
(iteration in offset order rather than insertion order: no caller relies
on the order, and the tests compare both as mappings).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, Sequence
from typing import Final, Generic, TypeVar, overload

#: The window's front is cut once this many offsets lie under the cursor: a
#: cut moves the rest of the list, so it is paid once per this many acks.
WINDOW_CUT: Final = 4096

_V = TypeVar("_V")
_D = TypeVar("_D")


class PendingWindow(MutableMapping[int, _V], Generic[_V]):
    """Offsets from ``base`` on to their pending delivery (module docstring)."""

    __slots__ = ("base", "entries")

    def __init__(self, base: int) -> None:
        self.base = base
        #: ``entries[at]``: the delivery of offset ``base + at``, or None.
        self.entries: list[_V | None] = []

    def __getitem__(self, offset: int) -> _V:
        at = offset - self.base
        if 0 <= at < len(self.entries):
            value = self.entries[at]
            if value is not None:
                return value
        raise KeyError(offset)

    def __setitem__(self, offset: int, value: _V) -> None:
        if value is None:
            raise TypeError("a pending window holds deliveries, not None")
        entries = self.entries
        at = offset - self.base
        if at < 0:
            # Below the window (no caller delivers under the cursor): the
            # front grows down to it.
            entries[:0] = [None] * -at
            self.base = offset
            at = 0
        size = len(entries)
        if at == size:
            entries.append(value)
            return
        if at > size:
            entries.extend([None] * (at - size))
            entries.append(value)
            return
        entries[at] = value

    def put_all(self, offsets: Sequence[int], value: _V) -> None:
        """``self[offset] = value`` for each of ``offsets`` (ascending), in
        one pass: the list grown once to the last of them, then an index
        store each, where a store through ``__setitem__`` was a method call
        a message (a tracker's ``deliver_group`` hands a group at once)."""
        if not offsets:
            return
        if value is None:
            raise TypeError("a pending window holds deliveries, not None")
        if offsets[0] < self.base:
            self[offsets[0]] = value  # grows the front down to it
        entries = self.entries
        base = self.base
        grow = offsets[-1] - base + 1 - len(entries)
        if grow > 0:
            entries.extend([None] * grow)
        for offset in offsets:
            entries[offset - base] = value

    def __delitem__(self, offset: int) -> None:
        at = offset - self.base
        entries = self.entries
        if 0 <= at < len(entries) and entries[at] is not None:
            entries[at] = None
            return
        raise KeyError(offset)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        at = offset - self.base
        return 0 <= at < len(self.entries) and self.entries[at] is not None

    @overload
    def get(self, offset: int, /) -> _V | None: ...
    @overload
    def get(self, offset: int, default: _V | _D, /) -> _V | _D: ...
    def get(self, offset: int, default: object = None) -> object:
        at = offset - self.base
        if 0 <= at < len(self.entries):
            value = self.entries[at]
            if value is not None:
                return value
        return default

    @overload
    def pop(self, offset: int, /) -> _V: ...
    @overload
    def pop(self, offset: int, default: _V, /) -> _V: ...
    @overload
    def pop(self, offset: int, default: _D, /) -> _V | _D: ...
    def pop(self, offset: int, *default: object) -> object:
        at = offset - self.base
        entries = self.entries
        if 0 <= at < len(entries):
            value = entries[at]
            if value is not None:
                entries[at] = None
                return value
        if default:
            return default[0]
        raise KeyError(offset)

    def __iter__(self) -> Iterator[int]:
        base = self.base
        return (base + at for at, value in enumerate(self.entries) if value is not None)

    def __len__(self) -> int:
        """Counted at C speed (``list.count``): asked for by statistics,
        not on the delivery or ack path."""
        return len(self.entries) - self.entries.count(None)

    def trim(self, cursor: int) -> None:
        """Cut the front under ``cursor`` (offsets acked: none is pending)
        once ``WINDOW_CUT`` offsets lie there, or when that is the whole
        window (then for free)."""
        cut = cursor - self.base
        entries = self.entries
        if cut >= WINDOW_CUT or (cut > 0 and cut >= len(entries)):
            front = entries[:cut]
            if front.count(None) != len(front):
                raise RuntimeError(f"a delivery under the cursor {cursor} is still pending")
            del entries[:cut]
            self.base += cut
