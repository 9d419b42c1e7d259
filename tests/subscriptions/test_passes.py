"""The subscription core's bulk passes: the per-offset steps of an ack
(``broky.subscriptions.ack_pass``), the slot table's owner stores
(``broky.subscriptions.slots.assign_pure``), a key-shared dispatcher's
fresh feed (``Dispatcher.feed_slots``) and a driver round's event passes
(``broky.subscriptions.round_events``). Each pure function against a
plain model, and its compiled twin (``broky.subscriptions._passes``) giving
exactly the same results and leaving exactly the same structures behind."""

from __future__ import annotations

import copy
import os
from array import array
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.subscriptions import ack_pass, dispatch, round_events, slots
from broky.subscriptions.acked_ranges import AckedRanges
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.model import (
    DeadLetter,
    Deliver,
    Event,
    Evict,
    Options,
    SubscriptionType,
)
from broky.subscriptions.slots import SLOT_TYPECODE, slot_of
from broky.subscriptions.tracker import SubscriptionImage
from tests.subscriptions.spans import held_spans

#: Offsets drawn from a small window, so that runs, neighbours and repeats are common.
_OFFSET = st.integers(0, 60)


def _twins(pure: object, compiled: object) -> list[object]:
    return [pure] if compiled is None else [pure, compiled]


def test_the_compiled_twins_are_built() -> None:
    """``make`` builds them; a silent fallback would leave the slow path on."""
    twins = (
        ack_pass.take_acked_compiled,
        ack_pass.merge_acked_compiled,
        ack_pass.held_after_compiled,
    )
    if os.environ.get("BROKY_PURE") == "1":
        assert twins == (None, None, None)
        assert slots.assign_compiled is None
        assert round_events.sort_segments_compiled is None
        assert dispatch.feed_fresh_compiled is None
        assert ack_pass.merge_acked is ack_pass.merge_acked_pure
        return
    assert all(twins), "broky.subscriptions._passes not built"
    assert slots.assign_compiled is not None
    assert round_events.needed_spans_compiled is not None
    assert round_events.event_bounds_compiled is not None
    assert round_events.sort_segments_compiled is not None
    assert dispatch.feed_fresh_compiled is not None, "broky.subscriptions._feed not built"


@given(
    st.dictionaries(_OFFSET, st.integers(1, 3)),
    st.dictionaries(_OFFSET, st.integers(0, 2)),
    st.sets(_OFFSET),
    st.lists(_OFFSET, max_size=80),
)
def test_take_acked_takes_each_delivered_offset_once(
    counts: dict[int, int], holders: dict[int, int], due: set[int], offsets: list[int]
) -> None:
    """An offset is delivered when it is pending or counted (a group
    delivery's offsets are pending and not counted: ``AckTracker.counts``)."""
    deliveries = [object() for _ in range(3)]
    pending = {offset: deliveries[index] for offset, index in holders.items()}
    due_at = dict.fromkeys(due, 1.0)
    taken = [o for o in dict.fromkeys(offsets) if o in counts or o in pending]
    ended = [offset for offset in taken if offset in pending]
    lost: dict[object, int] = {}
    for offset in ended:
        lost[pending[offset]] = lost.get(pending[offset], 0) + 1
    expected = (
        sorted(taken),
        ended,
        lost,
        [offset for offset in taken if offset not in pending and offset in due],
    )
    for take in _twins(ack_pass.take_acked_pure, ack_pass.take_acked_compiled):
        assert callable(take)
        left_counts, left_pending = dict(counts), dict(pending)
        assert take(left_counts, left_pending, due_at, iter(offsets)) == expected
        assert left_counts == {o: c for o, c in counts.items() if o not in taken}
        assert left_pending == {o: p for o, p in pending.items() if o not in taken}


@given(st.sets(_OFFSET), st.integers(0, 10), st.sets(_OFFSET))
def test_merge_acked_is_adding_each_offset(acked: set[int], cursor: int, new: set[int]) -> None:
    """The ranges and cursor after one merge of unacked offsets are those
    that adding them one by one gives."""
    offsets = sorted(offset for offset in new - acked if offset >= cursor)
    model = AckedRanges(cursor)
    for offset in sorted(acked):
        model.add(offset)
    start = (model.cursor, model.ranges())
    offsets = [offset for offset in offsets if offset not in model]
    for offset in offsets:
        model.add(offset)
    for merge in _twins(ack_pass.merge_acked_pure, ack_pass.merge_acked_compiled):
        assert callable(merge)
        firsts = [first for first, _ in start[1]]
        lasts = [last for _, last in start[1]]
        assert merge(firsts, lasts, start[0], offsets) == model.cursor
        assert list(zip(firsts, lasts, strict=True)) == list(model.ranges())


@given(
    st.dictionaries(_OFFSET, st.integers(0, 2)),
    st.dictionaries(_OFFSET, st.integers(0, 4)),
    st.lists(_OFFSET, max_size=60),
)
def test_take_acked_frees_the_slots_of_the_offsets_it_ends(
    holders_of: dict[int, int], slot_at: dict[int, int], offsets: list[int]
) -> None:
    """With an ordered dispatcher's slot maps, each offset whose pending
    delivery ends takes one off its slot's count of held offsets (its slot
    read from the window; 0 for one outside it); a slot left holding none
    loses its holder; the other slots keep theirs. What is returned is
    what ``take_acked`` gives without the maps."""
    deliveries = [object() for _ in range(3)]
    pending = {offset: deliveries[index] for offset, index in holders_of.items()}
    # The window starts at the lowest offset with a slot, so the others
    # below it fall outside (slot 0), as do those past its end.
    base = min(slot_at, default=0)
    window = [slot_at.get(offset, 0) for offset in range(base, max(slot_at, default=-1) + 1)]

    def slot_of(offset: int) -> int:
        return window[offset - base] if 0 <= offset - base < len(window) else 0

    # The counts: each pending offset's slot, as a dispatcher keeps them.
    held = Counter(slot_of(offset) for offset in pending)
    gone = Counter(slot_of(offset) for offset in dict.fromkeys(offsets) if offset in pending)
    # Each slot's hold is ``[holder, count]``; a slot left with none has no entry.
    expected_holds = {
        slot: [slot + 100, count - gone[slot]] for slot, count in held.items() if count > gone[slot]
    }
    expected = ack_pass.take_acked_pure({}, dict(pending), {}, list(offsets))
    for take in _twins(ack_pass.take_acked_pure, ack_pass.take_acked_compiled):
        assert callable(take)
        left_pending, left_window = dict(pending), list(window)
        left_holds = {slot: [slot + 100, count] for slot, count in held.items()}
        maps = (left_window, base, left_holds)
        assert take({}, left_pending, {}, iter(offsets), maps) == expected
        assert left_window == window
        assert left_holds == expected_holds


@pytest.mark.parametrize("name", ["merge_acked_pure", "merge_acked_compiled"])
def test_merge_acked_moves_the_cursor_over_every_range_it_reaches(name: str) -> None:
    """Acking the gap below the lowest range takes that range under the
    cursor too (it must not stay a range at the cursor)."""
    merge: Callable[[list[int], list[int], int, list[int]], int] | None = getattr(ack_pass, name)
    if merge is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    firsts, lasts = [3, 8], [5, 9]
    assert merge(firsts, lasts, 0, [0, 1, 2, 6, 7]) == 10
    assert (firsts, lasts) == ([], [])


@given(st.lists(st.integers(0, 40), max_size=60), st.integers(-1, 5))
def test_assign_stores_the_owner_of_every_slot(moved: list[int], owner: int) -> None:
    before = [slot % 3 for slot in range(41)]
    expected = [owner if slot in moved else previous for slot, previous in enumerate(before)]
    for assign in _twins(slots.assign_pure, slots.assign_compiled):
        assert callable(assign)
        owners = list(before)
        assign(owners, list(moved), owner)
        assert owners == expected
        # The slot table's own slots: an ``array("H")``.
        owners = list(before)
        assign(owners, array(SLOT_TYPECODE, moved), owner)
        assert owners == expected


def test_compiled_assign_refuses_a_slot_out_of_range_changing_nothing() -> None:
    if slots.assign_compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    owners = [0, 0, 0]
    with pytest.raises(IndexError):
        slots.assign_compiled(owners, [1, 3], 7)
    assert owners == [0, 0, 0]


def _dispatcher_state(dispatcher: Dispatcher) -> object:
    """Everything a feed can change, as plain values."""
    tracker = dispatcher.tracker
    return (
        [
            (e.consumer, e.offset, e.count, e.stop)
            for e in dispatcher.events
            if isinstance(e, Deliver)
        ],
        [e for e in dispatcher.events if not isinstance(e, Deliver)],
        tracker.read_position,
        tracker.counts,
        {
            o: (p.consumer, p.count, p.deadline, p.live, p.first, p.stop)
            for o, p in tracker.pending.items()
        },
        tracker.due,
        tracker.next_deadline(),
        dispatcher._window,
        dispatcher._window_base,
        dispatcher._holds,
        dispatcher._waiting,
        dispatcher.parked,
        {c: (s.credit, s.in_flight, s.last_progress) for c, s in dispatcher.consumers.items()},
    )


@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(1, 8)), min_size=1, max_size=4),
    st.lists(st.integers(0, 5), max_size=30),
    st.lists(st.integers(0, 5), min_size=1, max_size=30),
    st.sets(st.integers(0, 29)),
    st.booleans(),
)
# Two deep copies of a dispatcher (its slot table is 65,536 owners) per
# example: ~150 ms on a loaded 2-core machine, past the default deadline.
@settings(deadline=None)
def test_the_compiled_fresh_feed_decides_as_the_pure_one(
    consumers: list[tuple[int, int]],
    earlier: list[int],
    fed: list[int],
    nacked: set[int],
    committed: bool,
) -> None:
    """A key-shared dispatcher in any state an earlier read, its nacks
    (offsets due again, slots waiting) and credit left it in, fed a fresh
    read: the compiled loop (``_feed.feed_fresh``) leaves every structure
    as the pure ``feed_slots`` loop does."""
    if dispatch.feed_fresh_compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    keys = [slot_of(f"key-{key}".encode()) for key in range(6)]
    dispatcher = Dispatcher(
        Options(type=SubscriptionType.KEY_SHARED, ack_timeout=5.0, lease=24),
        SubscriptionImage(0),
        end_offset=100,
    )
    for consumer, (credit, max_in_flight) in enumerate(consumers):
        dispatcher.attach(consumer, 0.0, credit=credit, max_in_flight=max_in_flight)
    if committed:
        dispatcher.committed(dispatcher.tracker.image(), 0.0)
    dispatcher.feed_slots(0, [keys[key] for key in earlier], 1.0)
    for offset in sorted(nacked):
        held = dispatcher.tracker.pending.get(offset)
        if held is not None:
            dispatcher.nack(held.consumer, [offset], 1.5, 0.0)
    first = dispatcher.tracker.read_position
    slots = [keys[key] for key in fed]
    compiled, pure = copy.deepcopy(dispatcher), copy.deepcopy(dispatcher)
    compiled.feed_slots(first, slots, 2.0)
    saved, dispatch.feed_fresh_compiled = dispatch.feed_fresh_compiled, None
    try:
        pure.feed_slots(first, slots, 2.0)
    finally:
        dispatch.feed_fresh_compiled = saved
    assert _dispatcher_state(compiled) == _dispatcher_state(pure)


_EVENT = st.one_of(
    st.builds(
        Deliver, st.integers(0, 3), st.integers(0, 50), st.integers(1, 3), st.integers(0, 60)
    ),
    st.builds(DeadLetter, st.integers(0, 50), st.integers(1, 5), st.sampled_from(["", "poison"])),
    st.builds(Evict, st.integers(0, 3)),
)


@given(st.lists(st.lists(_EVENT, max_size=12), max_size=4))
def test_a_rounds_events_sort_alike_compiled_or_pure(batches: list[list[Event]]) -> None:
    """What a round reads for its events and how it groups each
    dispatcher's: the compiled passes answer as the pure ones, which keep
    the events' order (deliveries per consumer, the others apart)."""
    spans = round_events.needed_spans_pure(batches)
    assert spans == [
        (e.offset, e.stop if isinstance(e, Deliver) else e.offset + 1)
        for batch in batches
        for e in batch
        if not isinstance(e, Evict)
    ]
    for events in batches:
        per_consumer, delivered, redelivered, others = round_events.sort_events_pure(events)
        deliveries = [e for e in events if isinstance(e, Deliver)]
        assert others == [e for e in events if not isinstance(e, Deliver)]
        assert delivered == sum(e.stop - e.offset for e in deliveries)
        assert redelivered == sum(e.stop - e.offset for e in deliveries if e.count > 1)
        assert per_consumer == {
            c: [(e.offset, e.stop, e.count) for e in deliveries if e.consumer == c]
            for c in dict.fromkeys(e.consumer for e in deliveries)
        }
    # The bounds the driver checks first: those of the spans, without them.
    bounds = round_events.event_bounds_pure(batches)
    assert bounds == (
        (min(first for first, _ in spans), max(stop for _, stop in spans)) if spans else None
    )
    if round_events.needed_spans_compiled is None:
        return
    assert round_events.event_bounds_compiled is not None
    assert round_events.event_bounds_compiled(batches) == bounds
    assert round_events.needed_spans_compiled(batches) == spans


@settings(deadline=None)  # a shared, loaded machine: hypothesis deadlines fail at random
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 8)), max_size=6),
    st.lists(
        st.one_of(
            st.builds(
                Deliver,
                st.integers(0, 3),
                st.integers(0, 60),
                st.sampled_from([1, 1, 1, 2, 5]),
                st.integers(0, 66),
            ),
            _EVENT,
        ),
        max_size=30,
    ),
)
def test_a_rounds_events_sort_into_segments_alike_compiled_or_pure(
    layout: list[tuple[int, int]], events: list[Event]
) -> None:
    """Sorting a round's events and cutting each consumer's deliveries
    along held spans with gaps (deliveries past, between and across them,
    some redelivered, some empty): one compiled pass answers as the pure
    sort followed by the pure cut, consumers in the same order."""
    bases, stops = held_spans(layout)
    pure = round_events.sort_segments_pure(events, bases, stops)
    per_consumer, delivered, redelivered, others = round_events.sort_events_pure(events)
    assert pure[1:] == (delivered, redelivered, others)
    assert list(pure[0]) == list(per_consumer)
    compiled = round_events.sort_segments_compiled
    if compiled is None:
        return
    answer = compiled(events, bases, stops)
    assert answer == pure
    assert list(answer[0]) == list(pure[0])
