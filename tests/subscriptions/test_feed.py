"""Feeding read spans to a dispatcher (``feed_batches``, sans-IO): a shared
subscription takes a span whose keys its filter all accepts as one range,
and skips run by run what it rejects; ordered types see every message."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.router.matcher import SubscriptionIndex
from broky.storage.batch_reading import BatchSpan
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.model import Deliver, Options, SubscriptionType
from broky.subscriptions.partition import feed_batches
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
