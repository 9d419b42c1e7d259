"""Unit and property tests of the ack ranges, the slot table and the dispatcher's rules."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.subscriptions.acked_ranges import AckedRanges
from broky.subscriptions.dispatch import START_READ, Dispatcher
from broky.subscriptions.model import (
    DeadLetter,
    Deliver,
    Options,
    SubscriptionBusy,
    SubscriptionType,
)
from broky.subscriptions.slots import NOBODY, SLOTS, SlotTable, slot_of
from broky.subscriptions.tracker import AckTracker, SubscriptionImage, backoff_delay


@given(st.lists(st.integers(0, 200), max_size=120), st.integers(0, 20))
def test_acked_ranges_match_a_set(offsets: list[int], cursor: int) -> None:
    ranges = AckedRanges(cursor)
    model = set(range(cursor))
    for offset in offsets:
        assert ranges.add(offset) == (offset not in model)
        model.add(offset)
    assert all((offset in ranges) == (offset in model) for offset in range(260))
    assert ranges.cursor == min(set(range(300)) - model)
    restored = AckedRanges(ranges.cursor, ranges.ranges())
    assert restored.cursor == ranges.cursor
    assert restored.ranges() == ranges.ranges()


@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 12)), max_size=40),
    st.integers(0, 20),
)
def test_acked_ranges_add_range_matches_a_set(spans: list[tuple[int, int]], cursor: int) -> None:
    ranges = AckedRanges(cursor)
    model = set(range(cursor))
    for first, length in spans:
        ranges.add_range(first, first + length - 1)  # length 0: an empty range
        model.update(range(first, first + length))
    assert all((offset in ranges) == (offset in model) for offset in range(260))
    assert ranges.cursor == min(set(range(300)) - model)
    # Canonical: disjoint, not touching, above the cursor (as add keeps them).
    pairs = ranges.ranges()
    assert all(first > ranges.cursor for first, _ in pairs[:1])
    assert all(last + 1 < first for (_, last), (first, _) in itertools.pairwise(pairs))
    assert AckedRanges(ranges.cursor, pairs).ranges() == pairs
    # What the backlog counts: the acked offsets above the cursor below each end.
    for end in range(-1, 262, 7):
        above = {offset for offset in model if ranges.cursor <= offset < end}
        assert ranges.count_below(end) == len(above)


def test_a_shared_read_goes_as_spans_whose_offsets_settle_one_by_one() -> None:
    dispatcher = ready(SubscriptionType.SHARED, 10, ack_timeout=2.0, backoff=())
    dispatcher.attach(1, 0.0, credit=100, max_in_flight=100)
    dispatcher.queue(0, 10)
    dispatcher.pump(0.0)
    assert dispatcher.events == [Deliver(1, 0, 1, 10)]  # one event, one delivery
    dispatcher.events.clear()
    tracker = dispatcher.tracker
    assert len({id(tracker.pending[offset]) for offset in range(10)}) == 1
    assert dispatcher.ack(1, range(2, 5), 0.5) == 0
    assert dispatcher.consumers[1].in_flight == 7
    dispatcher.in_progress(1, [6], 1.0)  # only offset 6 gets a new deadline
    dispatcher.tick(2.0)
    dispatcher.committed(tracker.image(), 2.0)
    # Expired together (6 extended): redelivered one by one, count 2.
    assert deliveries(dispatcher) == [(1, offset, 2) for offset in (0, 1, 5, 7, 8, 9)]
    dispatcher.tick(3.0)
    dispatcher.committed(tracker.image(), 3.0)
    assert dispatcher.events == [Deliver(1, 6, 2, 7)]
    assert tracker.next_deadline() == 4.0  # the redelivered ones' (one timer each)


def test_a_settle_acks_span_pieces_in_one_step_and_the_rest_one_by_one() -> None:
    dispatcher = ready(SubscriptionType.SHARED, 30, ack_timeout=2.0, backoff=())
    dispatcher.attach(1, 0.0, credit=10, max_in_flight=100)
    dispatcher.queue(0, 10)
    dispatcher.pump(0.0)
    dispatcher.attach(2, 0.0, credit=20, max_in_flight=100)
    for first in (10, 20):  # two reads: two spans
        dispatcher.queue(first, first + 10)
        dispatcher.pump(0.0)
    assert dispatcher.events == [Deliver(1, 0, 1, 10), Deliver(2, 10, 1, 20), Deliver(2, 20, 1, 30)]
    dispatcher.events.clear()
    tracker = dispatcher.tracker
    # Consumer 1's whole span, ended as one delivery.
    assert dispatcher.ack_ranges(1, [range(10)], 0.5) == 0
    assert tracker.pending.keys().isdisjoint(range(10)), "no offset of it left pending"
    assert all(offset in tracker.acked for offset in range(10))
    assert 10 not in tracker.acked
    assert dispatcher.consumers[1].in_flight == 0
    # Consumer 2 acks one whole span and half the next: a piece of it.
    assert dispatcher.ack_ranges(2, [range(10, 25)], 0.5) == 0
    assert dispatcher.consumers[2].in_flight == 5
    assert sorted(tracker.pending) == list(range(25, 30))
    # 27 gets a delivery of its own: a range over it goes one by one.
    dispatcher.in_progress(2, [27], 0.55)
    assert dispatcher.ack_ranges(2, [range(25, 29)], 0.6) == 0
    assert sorted(tracker.pending) == [29]
    assert dispatcher.consumers[2].in_flight == 1
    # Acked again (nothing left to end) and a stale ack of another's span.
    assert dispatcher.ack_ranges(1, [range(10), range(29, 30)], 0.6) == 1
    assert dispatcher.consumers[2].in_flight == 0
    assert tracker.cursor == 30
    assert tracker.next_deadline() is None, "every span's timer is void"
    dispatcher.tick(5.0)
    assert deliveries(dispatcher) == []


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=14))
def test_slot_table_stays_exactly_balanced_with_few_moves(steps: list[tuple[bool, int]]) -> None:
    table = SlotTable()
    for join, consumer in steps:
        before = len(table.counts)
        moves = table.join(consumer) if join else table.leave(consumer)
        low, high = table.spread()
        assert high - low <= 1
        assert sum(table.counts.values()) == (SLOTS if table.counts else 0)
        moved = [slot for slots, _, _ in moves for slot in slots]
        assert len(moved) == len(set(moved))
        if join and before and len(table.counts) > before:
            assert len(moved) == SLOTS // len(table.counts)  # only the newcomer's share moves
        for slots, old, new in moves:
            assert old != new
            assert all(table.owner(slot) == new for slot in slots)
    if not table.counts:
        assert table.owner(0) == NOBODY


def test_slot_of_uses_16_bits() -> None:
    assert all(0 <= slot_of(f"key-{i}".encode()) < SLOTS for i in range(100))


def test_backoff_repeats_its_last_step() -> None:
    assert [backoff_delay((1.0, 5.0), n) for n in (1, 2, 3, 9)] == [1.0, 5.0, 5.0, 5.0]
    assert backoff_delay((), 3) == 0.0


def ready(kind: SubscriptionType, end: int, **options: object) -> Dispatcher:
    dispatcher = Dispatcher(Options(type=kind, **options), SubscriptionImage(0), end)  # type: ignore[arg-type]
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    return dispatcher


def feed(dispatcher: Dispatcher, slots: list[int], now: float = 0.0) -> None:
    start = dispatcher.tracker.read_position
    for offset in range(start, start + dispatcher.wants()):
        dispatcher.feed(offset, slots[offset], now)


def deliveries(dispatcher: Dispatcher) -> list[tuple[int, int, int]]:
    events, dispatcher.events = dispatcher.events, []
    return [
        (e.consumer, offset, e.count)
        for e in events
        if isinstance(e, Deliver)
        for offset in range(e.offset, e.stop)
    ]


def test_exclusive_refuses_a_second_consumer() -> None:
    dispatcher = ready(SubscriptionType.EXCLUSIVE, 0)
    dispatcher.attach(1, 0.0, credit=10, max_in_flight=10)
    try:
        dispatcher.attach(2, 0.0, credit=10, max_in_flight=10)
    except SubscriptionBusy:
        return
    raise AssertionError("second consumer accepted")


def test_shared_round_robin_and_redelivery_on_detach() -> None:
    dispatcher = ready(SubscriptionType.SHARED, 4)
    dispatcher.attach(1, 0.0, credit=10, max_in_flight=10)
    dispatcher.attach(2, 0.0, credit=10, max_in_flight=10)
    feed(dispatcher, [0] * 4)
    assert deliveries(dispatcher) == [(1, 0, 1), (2, 1, 1), (1, 2, 1), (2, 3, 1)]
    dispatcher.detach(1, 1.0)
    dispatcher.committed(dispatcher.tracker.image(), 1.0)  # a redelivery waits for its count
    assert deliveries(dispatcher) == [(2, 0, 2), (2, 2, 2)]


def test_shared_deals_a_read_in_consecutive_slices_by_free_credit() -> None:
    dispatcher = ready(SubscriptionType.SHARED, 8)
    dispatcher.attach(1, 0.0, credit=12, max_in_flight=100)
    dispatcher.attach(2, 0.0, credit=4, max_in_flight=100)
    dispatcher.queue(0, 8)
    assert deliveries(dispatcher) == []  # queued only: the pump deals
    dispatcher.pump(0.0)
    # 12 of the 16 free: consumer 1 takes 3/4 of the 8, as one run; 2 the rest.
    assert [(c, o) for c, o, _ in deliveries(dispatcher)] == [
        *((1, offset) for offset in range(6)),
        (2, 6),
        (2, 7),
    ]


def test_nack_backoff_then_dead_letter_after_max_deliveries() -> None:
    dispatcher = ready(SubscriptionType.SHARED, 1, backoff=(1.0,), max_deliveries=2)
    dispatcher.attach(1, 0.0, credit=10, max_in_flight=10)
    feed(dispatcher, [0])
    assert deliveries(dispatcher) == [(1, 0, 1)]
    dispatcher.nack(1, [0], 0.0, None, "boom")
    dispatcher.committed(dispatcher.tracker.image(), 0.5)
    assert deliveries(dispatcher) == []  # backoff: not before 1 s
    dispatcher.tick(1.0)
    assert deliveries(dispatcher) == [(1, 0, 2)]
    dispatcher.nack(1, [0], 1.0, 0.0, "boom again")
    dispatcher.committed(dispatcher.tracker.image(), 1.0)
    assert dispatcher.events == [DeadLetter(0, 2, "boom again")]
    dispatcher.events.clear()
    dispatcher.dead_lettered([0], 1.0)
    assert dispatcher.tracker.cursor == 1


def test_ack_timeout_redelivers_and_stale_ack_is_accepted() -> None:
    dispatcher = ready(SubscriptionType.SHARED, 1, ack_timeout=2.0, backoff=())
    dispatcher.attach(1, 0.0, credit=10, max_in_flight=10)
    feed(dispatcher, [0])
    deliveries(dispatcher)
    dispatcher.detach(1, 0.1)
    dispatcher.attach(2, 0.1, credit=10, max_in_flight=10)
    dispatcher.committed(dispatcher.tracker.image(), 0.1)
    assert deliveries(dispatcher) == [(2, 0, 2)]
    assert dispatcher.ack(1, [0], 0.2) == 1  # the old holder's ack: stale, accepted
    assert dispatcher.tracker.cursor == 1
    assert dispatcher.consumers[2].in_flight == 0


def test_key_shared_moved_slot_waits_only_for_its_own_messages() -> None:
    # Which slots a second consumer takes is the table's to choose: ask one.
    probe = SlotTable()
    probe.join(1)
    probe.join(2)
    moving, staying = probe.slots_of(2)[0], probe.slots_of(1)[0]
    slots = [moving, staying, moving, staying]
    dispatcher = ready(SubscriptionType.KEY_SHARED, 4)
    dispatcher.attach(1, 0.0, credit=10, max_in_flight=10)
    feed(dispatcher, slots)
    assert deliveries(dispatcher) == [(1, 0, 1), (1, 1, 1), (1, 2, 1), (1, 3, 1)]
    dispatcher.attach(2, 0.0, credit=10, max_in_flight=10)
    assert (dispatcher.owner_of(moving), dispatcher.owner_of(staying)) == (2, 1)
    dispatcher.ack(1, [0], 0.0)
    assert deliveries(dispatcher) == []
    dispatcher.end_offset = 6
    dispatcher.feed(4, moving, 0.0)  # its slot still has offset 2 at consumer 1: parked
    dispatcher.feed(5, staying, 0.0)  # this slot stays with 1 and flows
    assert deliveries(dispatcher) == [(1, 5, 1)]
    dispatcher.ack(1, [2], 0.0)  # the drain ends: 4 goes to the new owner
    assert deliveries(dispatcher) == [(2, 4, 1)]


def test_key_shared_needs_an_ack_timeout() -> None:
    try:
        Dispatcher(Options(type=SubscriptionType.KEY_SHARED, ack_timeout=0), SubscriptionImage(0))
    except ValueError:
        return
    raise AssertionError("accepted")


@pytest.mark.parametrize("kind", [SubscriptionType.EXCLUSIVE, SubscriptionType.KEY_SHARED])
def test_a_redelivery_rewinds_the_later_messages_of_its_slot(kind: SubscriptionType) -> None:
    dispatcher = ready(kind, 4, backoff=())
    dispatcher.attach(1, 0.0, credit=10, max_in_flight=10)
    feed(dispatcher, [7, 7, 9, 7])
    assert [offset for _, offset, _ in deliveries(dispatcher)] == [0, 1, 2, 3]
    dispatcher.nack(1, [1], 0.0, 0.0)
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    again = [(offset, count) for _, offset, count in deliveries(dispatcher)]
    if kind is SubscriptionType.KEY_SHARED:
        assert again == [(1, 2), (3, 2)]  # slot 7 only; offset 2 (slot 9) stays out
    else:
        assert again == [(1, 2), (2, 2), (3, 2)]


def test_failover_spreads_partitions_over_the_top_priority_consumers() -> None:
    """As Pulsar: partition p's active consumer is the (p mod n)-th of the n
    highest-priority consumers by attach order, not the first everywhere."""
    partitions = []
    for number in range(8):
        dispatcher = Dispatcher(
            Options(type=SubscriptionType.FAILOVER), SubscriptionImage(0), 0, spread=number
        )
        dispatcher.attach(1, 0.0, credit=10, max_in_flight=10)
        dispatcher.attach(2, 0.0, credit=10, max_in_flight=10)
        dispatcher.attach(3, 0.0, credit=10, max_in_flight=10)
        dispatcher.attach(4, 0.0, credit=10, max_in_flight=10, priority=-1)  # standby only
        partitions.append(dispatcher)
    assert [d.active for d in partitions] == [1, 2, 3, 1, 2, 3, 1, 2]
    for dispatcher in partitions:
        dispatcher.detach(2, 1.0)
    assert [d.active for d in partitions] == [1, 3, 1, 3, 1, 3, 1, 3]
    for dispatcher in partitions:
        dispatcher.detach(1, 1.0)
        dispatcher.detach(3, 1.0)
    assert {d.active for d in partitions} == {4}  # the lower priority takes over


def test_a_group_delivery_expires_only_its_unacked_offsets() -> None:
    """``deliver_group``: ascending offsets with gaps, one timer; the acked
    offset is not redelivered, the gap (another consumer's) never was the
    group's, and the timer is void once every offset of it ended."""
    tracker = AckTracker(SubscriptionImage(0, limit=100), ack_timeout=5.0)
    group = tracker.deliver_group([3, 5, 9], 1, 0.0)
    other = tracker.deliver(4, 2, 0.0)
    assert (group.live, tracker.read_position) == (3, 10)
    tracker.ack_delivered([5])
    assert tracker.next_deadline() == 5.0
    assert list(tracker.expired(5.0)) == [(3, group), (9, group), (4, other)]
    assert tracker.release(3, 6.0) is group
    assert tracker.release(9, 6.0) is group
    assert group.live == 0
    assert tracker.next_deadline() is None


def test_a_group_delivery_counts_its_offsets_without_a_count_entry() -> None:
    """A group's offsets are counted delivered once through the group (no
    ``counts`` entry); one taken back keeps that count (persisted, and the
    next delivery is its second), an acked one leaves nothing behind."""
    tracker = AckTracker(SubscriptionImage(0, limit=100), ack_timeout=5.0, end_offset=0)
    group = tracker.deliver_group([3, 5, 9], 1, 0.0)
    assert tracker.counts == {}
    assert [tracker.count(o) for o in (3, 4, 5, 9)] == [1, 0, 1, 1]
    assert not tracker.may_deliver(3)  # delivered once, no image records it
    assert tracker.release(5, 1.0) is group
    assert (tracker.counts, tracker.count(5)) == ({5: 1}, 1)
    assert tracker.image().counts == ((5, 1),)
    assert tracker.deliver(5, 2, 1.0).count == 2
    ended, lost, waiting = tracker.ack_delivered([3, 5, 4])
    assert (sorted(ended), waiting) == ([3, 5], [])
    assert (lost[group], group.live) == (1, 1)
    assert (tracker.counts, sorted(tracker.pending)) == ({}, [9])
    assert (tracker.cursor, list(tracker.acked.ranges())) == (0, [(3, 3), (5, 5)])


@pytest.mark.parametrize("kind", [SubscriptionType.EXCLUSIVE, SubscriptionType.KEY_SHARED])
def test_a_read_never_starts_below_the_cursor(kind: SubscriptionType) -> None:
    """Offset 2 was acked before a restart (a range of the image); the
    first read after it stops at 2 (the consumer's room); acking 0 and 1
    moves the cursor over 2. The next read starts at the cursor, not at 2:
    2 is not delivered again (found by the dispatcher state machine)."""
    options = Options(type=kind, ack_timeout=5.0, lease=8)
    image = SubscriptionImage(0, ((2, 2),), 8)
    dispatcher = Dispatcher(options, image, 3)
    dispatcher.attach(1, 0.0, credit=3, max_in_flight=2)
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    slot = slot_of(b"k")
    dispatcher.feed_slots(0, [slot] * dispatcher.wants(), 0.0)
    delivered = [e.offset for e in dispatcher.events if isinstance(e, Deliver)]
    assert delivered == [0, 1]
    dispatcher.events.clear()
    dispatcher.ack(1, [0, 1], 0.0)
    assert dispatcher.tracker.read_position == dispatcher.tracker.cursor == 3
    assert dispatcher.wants() == 0
    assert not dispatcher.events


def test_a_span_ack_reaching_an_offset_taken_back_acks_the_rest_one_by_one() -> None:
    """A span of 4 with offset 3 taken back (termed): a settle of 2..3 acks
    no span piece (3 is no longer the span's) and leaves 2 to the
    one-by-one path, instead of a KeyError (found by the dispatcher state
    machine)."""
    tracker = AckTracker(SubscriptionImage(0, (), 100), ack_timeout=5.0)
    tracker.committed(tracker.image())
    tracker.deliver_span(0, 4, 2, 0.0)
    tracker.release(3, 0.0, "poison")
    assert tracker.ack_spans(range(2, 4)) == ([], 2)


@pytest.mark.parametrize("kind", [SubscriptionType.SHARED, SubscriptionType.KEY_SHARED])
def test_the_first_read_after_an_attach_is_small_then_the_whole_room(
    kind: SubscriptionType,
) -> None:
    """A consumer attached to a backlog: the first round reads START_READ
    offsets, so the first messages go out after a small read; the next
    reads fill the room, also once the consumer acked all it held (a cap
    then would only make more, smaller rounds); another attach is small
    again."""
    end = 8 * START_READ
    dispatcher = Dispatcher(Options(type=kind, lease=end), SubscriptionImage(0), end)
    dispatcher.attach(1, 0.0, credit=3 * START_READ, max_in_flight=4 * START_READ)
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    assert dispatcher.wants() == START_READ
    for offset in range(START_READ):
        dispatcher.feed(offset, slot_of(b"k"), 0.0)
    assert len(deliveries(dispatcher)) == START_READ
    assert dispatcher.wants() == 2 * START_READ  # the credit left
    dispatcher.ack(1, range(START_READ), 0.0)
    assert dispatcher.wants() == 2 * START_READ  # caught up: still the whole room
    dispatcher.attach(2, 0.0, credit=3 * START_READ, max_in_flight=4 * START_READ)
    assert dispatcher.wants() == START_READ
    assert dispatcher.wants() == 5 * START_READ
