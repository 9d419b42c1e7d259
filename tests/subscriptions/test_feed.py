"""Feeding read spans to a dispatcher (``feed_batches``, sans-IO): a shared
subscription takes a span whose keys its filter all accepts as one range,
and skips run by run what it rejects; ordered types see every message."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.router.matcher import SubscriptionIndex
from broky.storage.batch_reading import BatchSpan
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.feeding import feed_batches
from broky.subscriptions.model import Deliver, Options, SubscriptionType
from broky.subscriptions.tracker import SubscriptionImage
from tests.subscriptions.test_delivery import span


def _delivered(kind: SubscriptionType, spans: list[BatchSpan], pattern: bytes) -> list[int]:
    end = spans[-1].stop
    dispatcher = Dispatcher(Options(type=kind), SubscriptionImage(0), end)
    dispatcher.attach(1, 0.0, credit=10**6, max_in_flight=10**6)
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    matcher: SubscriptionIndex[int] = SubscriptionIndex()
    matcher.add(pattern, 0)
    feed_batches(dispatcher, matcher, spans, 0.0)
    return sorted(
        offset
        for event in dispatcher.events
        if isinstance(event, Deliver)
        for offset in range(event.offset, event.stop)
    )


# No deadline: each example builds a dispatcher with a 65,536-slot table,
# which missed hypothesis' 200 ms on the shared, loaded machine (both tests).
@settings(deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=5), min_size=1, max_size=4),
    kind=st.sampled_from(list(SubscriptionType)),
    pattern=st.sampled_from([b"orders.>", b"orders.k1", b"orders.*", b"other"]),
)
def test_every_message_whose_key_matches_is_delivered_once(
    shapes: list[list[int]], kind: SubscriptionType, pattern: bytes
) -> None:
    spans, base = [], 0
    for run_counts in shapes:
        spans.append(span(base, run_counts))
        base += sum(run_counts)
    matcher: SubscriptionIndex[int] = SubscriptionIndex()
    matcher.add(pattern, 0)
    expected = [
        run.base_offset + index
        for held in spans
        for run in held.runs()
        if matcher.match(run.key)
        for index in range(run.count)
    ]
    assert _delivered(kind, spans, pattern) == expected


# No deadline: each example builds a dispatcher with a 65,536-slot table,
# which missed hypothesis' 200 ms on the shared, loaded machine (both tests).
@settings(deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=5), min_size=1, max_size=4),
    kind=st.sampled_from(list(SubscriptionType)),
)
def test_no_filter_takes_every_message(shapes: list[list[int]], kind: SubscriptionType) -> None:
    """A subscription whose pattern covers its topic's has no filter (None):
    every message read is delivered, none looked up."""
    spans, base = [], 0
    for run_counts in shapes:
        spans.append(span(base, run_counts))
        base += sum(run_counts)
    dispatcher = Dispatcher(Options(type=kind), SubscriptionImage(0), base)
    dispatcher.attach(1, 0.0, credit=10**6, max_in_flight=10**6)
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    feed_batches(dispatcher, None, spans, 0.0)
    delivered = sorted(
        offset
        for event in dispatcher.events
        if isinstance(event, Deliver)
        for offset in range(event.offset, event.stop)
    )
    assert delivered == list(range(base))


def test_the_slot_window_learns_each_read_once_and_drops_what_the_cursor_passed() -> None:
    """``note_slots``: a re-read changes nothing, a gap (offsets skipped
    unread) is slot 0, an empty window starts at the first offset noted;
    ``trim_window`` cuts the offsets under the cursor once they are many,
    or all of them once the cursor passed the window's end."""
    dispatcher = Dispatcher(Options(type=SubscriptionType.KEY_SHARED), SubscriptionImage(0), 10**6)
    dispatcher.note_slots(0, [7, 8, 9])
    dispatcher.note_slots(1, [70, 80, 90])  # 1 and 2 known: only 3 is new
    dispatcher.note_slots(6, [5])  # 4 and 5 skipped unread
    assert (dispatcher._window_base, dispatcher._window) == (0, [7, 8, 9, 90, 0, 0, 5])
    dispatcher.tracker.ack_unread(0)
    dispatcher.trim_window()  # one offset under the cursor: not worth a cut
    assert dispatcher._window_base == 0
    for offset in range(1, 7):
        dispatcher.tracker.ack_unread(offset)
    dispatcher.trim_window()  # the cursor passed the window's end
    assert (dispatcher._window_base, dispatcher._window) == (7, [])
    dispatcher.note_slots(20, [3, 4])
    assert (dispatcher._window_base, dispatcher._window) == (20, [3, 4])
    failover = Dispatcher(Options(type=SubscriptionType.FAILOVER), SubscriptionImage(5), 10**6)
    failover.note_slots(5, [1, 2])  # the other ordered types: one slot, 0
    assert (failover._window_base, failover._window) == (5, [0, 0])
