"""The per-offset steps of an ack, each one pass over a settle's offsets (sans-IO).

Why their own module: a key-shared consumer's acks are scattered offsets
(with 4 consumers over 1,000 keys its acked runs are ~1.3 offsets long), so
an ack pays its bookkeeping per offset: take the offset out of the
tracker's counts and pending deliveries, merge it into the acked ranges,
free its slot. Done offset by offset in Python these were ~18 % of a
broker's event loop in ``bench_consumers``' key-shared row. Each step here
is one loop over all of a settle's offsets of a partition, with a compiled
twin (``broky.subscriptions._passes``) that runs the same loop in C and gives
the same results (hypothesis holds them equal,
``tests/subscriptions/test_passes.py``); ``BROKY_PURE=1`` or a missing
build runs these.

The structures are the callers' (the tracker's maps and acked ranges, the
dispatcher's slot maps): the functions change them in place and own nothing.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Container, Iterable, MutableMapping
from typing import Protocol, TypeVar

from broky.compiled import compiled_twin

_Delivery = TypeVar("_Delivery")

#: An ordered dispatcher's slot maps (``DispatchCore``): the slot window
#: (the slot of each offset read from the window's base on) and its base,
#: and per slot with pending offsets ``[its holder, how many]``.
SlotMaps = tuple[list[int], int, dict[int, list[int]]]


class TakeAcked(Protocol):
    """The signature of :func:`take_acked_pure` and its compiled twin."""

    def __call__(
        self,
        counts: dict[int, int],
        pending: MutableMapping[int, _Delivery],
        due: dict[int, float],
        offsets: Iterable[int],
        slots: SlotMaps | None = None,
    ) -> tuple[list[int], list[int], dict[_Delivery, int], list[int]]: ...


def take_acked_pure(
    counts: dict[int, int],
    pending: MutableMapping[int, _Delivery],
    due: dict[int, float],
    offsets: Iterable[int],
    slots: SlotMaps | None = None,
) -> tuple[list[int], list[int], dict[_Delivery, int], list[int]]:
    """Take every offset of ``offsets`` that is delivered and unacked (in
    ``pending``, or counted in ``counts``: a group delivery's offsets are in
    ``pending`` only) out of both (the others, and repeats, are skipped: an
    ack of a message never delivered, or acked already, acks nothing).

    Returns ``done``, the offsets taken, ascending (what the acked ranges
    take, ``merge_acked``); ``ended``, those that were pending (their
    delivery ended), in the order given; how many offsets each delivery
    lost (a delivery is counted, not listed per offset: a group delivery
    holds many); and ``waiting``, the offsets taken that were due for a
    redelivery rather than pending (in ``due``, which stays untouched).

    ``slots``: an ordered dispatcher's slot maps, each ended offset's
    slot freed in the same pass (``free_slot``): one loop over a settle's
    offsets rather than a second one over ``ended`` (a key-shared consumer
    acks scattered offsets, so both loops ran once per acked message)."""
    done: list[int] = []
    ended: list[int] = []
    lost: dict[_Delivery, int] = {}
    waiting: list[int] = []
    if slots is not None:
        window, base, holds = slots
    for offset in offsets:
        held = pending.pop(offset, None)
        if held is None:
            if counts.pop(offset, None) is None:
                continue
            done.append(offset)
            if offset in due:
                waiting.append(offset)
            continue
        # A group's offsets have no count entry (``AckTracker.counts``).
        counts.pop(offset, None)
        done.append(offset)
        ended.append(offset)
        if slots is not None:
            free_slot(window, base, holds, offset)
        lost[held] = lost.get(held, 0) + 1
    done.sort()
    return done, ended, lost, waiting


def merge_acked_pure(firsts: list[int], lasts: list[int], cursor: int, offsets: list[int]) -> int:
    """Mark ``offsets`` acked in the ranges ``firsts``/``lasts`` (sorted,
    disjoint, inclusive, above ``cursor``; changed in place); returns the
    new cursor.

    ``offsets``: ascending, distinct, at or above ``cursor`` and in no
    range (offsets still counted as delivered, ``take_acked``'s ``done``).
    One merge of the ranges they can touch with their runs, spliced in
    once: a settle's scattered offsets cost one pass, not one bisection
    and one list insert each."""
    if not offsets:
        return cursor
    low = bisect_left(lasts, offsets[0] - 1)
    high = bisect_right(firsts, offsets[-1] + 1)
    merged_firsts: list[int] = []
    merged_lasts: list[int] = []
    index = low

    def take(first: int, last: int) -> None:
        if merged_lasts and first <= merged_lasts[-1] + 1:
            merged_lasts[-1] = max(merged_lasts[-1], last)
        else:
            merged_firsts.append(first)
            merged_lasts.append(last)

    for offset in offsets:
        while index < high and firsts[index] < offset:
            take(firsts[index], lasts[index])
            index += 1
        take(offset, offset)
    while index < high:
        take(firsts[index], lasts[index])
        index += 1
    firsts[low:high] = merged_firsts
    lasts[low:high] = merged_lasts
    # The ranges the cursor reaches leave in one cut.
    drop = 0
    while drop < len(firsts) and firsts[drop] <= cursor:
        cursor = max(cursor, lasts[drop] + 1)
        drop += 1
    del firsts[:drop], lasts[:drop]
    return cursor


def free_slot(window: list[int], base: int, holds: dict[int, list[int]], offset: int) -> int:
    """An ordered dispatcher's side of ``offset``'s delivery ending: its
    slot holds one offset less (``holds``: slot -> ``[holder, count]``,
    ``DispatchCore._holds``), and a slot holding none has no holder any
    more (it may move to its new owner). Returns the slot, read from the
    slot window (0 for an offset outside it). The caller ends each pending
    offset once (``take_acked`` ends only offsets it took from
    ``pending``)."""
    slot = window[offset - base] if 0 <= offset - base < len(window) else 0
    hold = holds.get(slot)
    if hold is not None:
        if hold[1] > 1:
            hold[1] -= 1
        else:
            del holds[slot]
    return slot


def held_after_pure(
    window: list[int], base: int, slot: int, offset: int, pending: Container[int]
) -> list[int]:
    """The offsets of ``slot`` past ``offset`` that are in ``pending``,
    ascending, read from the slot window (``window[i]`` is the slot of
    offset ``base + i``): what a rewind takes back with ``offset``.

    Why a pass of its own: an ordered dispatcher counts each slot's
    pending offsets instead of listing them (``free_slot``: an ack is a
    counter store), so a rewind (nack, ack timeout, detach) finds them by
    a scan of the window from ``offset`` on; the compiled twin
    (``broky.subscriptions._passes.held_after``) reads the slots and a
    ``PendingWindow``'s entries in C (a 50,000-offset window: ~1 ms with
    ``list.index``)."""
    later: list[int] = []
    at = max(offset + 1 - base, 0)
    while True:
        try:
            at = window.index(slot, at)  # the next offset of the slot, at C speed
        except ValueError:
            return later
        if base + at in pending:
            later.append(base + at)
        at += 1


HeldAfter = Callable[[list[int], int, int, int, Container[int]], list[int]]
MergeAcked = Callable[[list[int], list[int], int, list[int]], int]

_MODULE = "broky.subscriptions._passes"
#: The compiled twins, when built (None otherwise, and with ``BROKY_PURE=1``).
take_acked_compiled: TakeAcked | None = compiled_twin(_MODULE, "take_acked")
merge_acked_compiled: MergeAcked | None = compiled_twin(_MODULE, "merge_acked")
held_after_compiled: HeldAfter | None = compiled_twin(_MODULE, "held_after")
take_acked: TakeAcked = take_acked_compiled or take_acked_pure
held_after: HeldAfter = held_after_compiled or held_after_pure
merge_acked: MergeAcked = merge_acked_compiled or merge_acked_pure
