"""A driver round's events sorted for carrying out (sans-IO).

Each round hands the dispatchers' events (``Deliver``, ``DeadLetter``,
``Evict``) to the partition driver (``partition.py``), which reads the
messages they need and sends them. Why passes of their own: a key-shared
round has about one ``Deliver`` per message (a consumer's runs average
~1.3 messages over 1,000 keys), and looking at each twice in Python (what
to read, then whom to send it) was ~6 % of the broker's event loop. The
compiled twins (``broky.subscriptions._feed``) run the same loops in C
with the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broky.compiled import compiled_twin
from broky.subscriptions.delivery import Segment, delivery_segments_pure
from broky.subscriptions.model import DeadLetter, Deliver, Event

#: Per consumer, its deliveries ``(first, stop, delivery count)`` in decision order.
PerConsumer = dict[int, list[tuple[int, int, int]]]
Sorted = tuple[PerConsumer, int, int, list[Event]]
#: Per consumer, its deliveries cut along the held spans: ``delivery_segments``' answer.
SegmentsPerConsumer = dict[int, tuple[list[Segment], list[int]]]
SortedSegments = tuple[SegmentsPerConsumer, int, int, list[Event]]


def needed_spans_pure(batches: Iterable[list[Event]]) -> list[tuple[int, int]]:
    """The offsets ``[first, stop)`` that the deliveries and dead letters of
    ``batches`` (each a dispatcher's events) carry, in order."""
    spans: list[tuple[int, int]] = []
    for batch in batches:
        for event in batch:
            if isinstance(event, Deliver):
                spans.append((event.offset, event.stop))
            elif isinstance(event, DeadLetter):
                spans.append((event.offset, event.offset + 1))
    return spans


def event_bounds_pure(batches: Iterable[list[Event]]) -> tuple[int, int] | None:
    """The lowest first and the highest stop of :func:`needed_spans_pure`'s
    spans, without the spans (None when there are none).

    Why: in the usual round every delivery lies in batches the round just
    read, and the driver only needs these two bounds to see that
    (``BatchCache.holds``); the list of spans (a tuple per event, about one
    per message or two in a key-shared round) is built only when it does
    not."""
    low: int | None = None
    high = 0
    for batch in batches:
        for event in batch:
            if isinstance(event, Deliver):
                first, stop = event.offset, event.stop
            elif isinstance(event, DeadLetter):
                first, stop = event.offset, event.offset + 1
            else:
                continue
            if low is None:
                low, high = first, stop
            else:
                low, high = min(low, first), max(high, stop)
    return None if low is None else (low, high)


def sort_events_pure(events: list[Event]) -> Sorted:
    """One dispatcher's events: its deliveries per consumer, how many
    messages they deliver and how many of those again, and the other
    events (dead letters, evictions) in order."""
    per_consumer: PerConsumer = {}
    delivered = redelivered = 0
    others: list[Event] = []
    for event in events:
        if not isinstance(event, Deliver):
            others.append(event)
            continue
        first, stop, count = event.offset, event.stop, event.count
        per_consumer.setdefault(event.consumer, []).append((first, stop, count))
        delivered += stop - first
        if count > 1:
            redelivered += stop - first
    return per_consumer, delivered, redelivered, others


def sort_segments_pure(events: list[Event], bases: list[int], stops: list[int]) -> SortedSegments:
    """:func:`sort_events_pure`, each consumer's deliveries then cut along
    the held spans ``[bases[i], stops[i])`` (``delivery_segments_pure``):
    what a round carries out, per consumer.

    Why one pass: a key-shared round has a ``Deliver`` per message or two,
    and sorting them made a tuple per delivery that the cut read back
    straight after (together ~10 % of the broker's samples in
    ``bench_consumers``' key-shared row). The compiled twin cuts each
    event as it sorts it, with no tuple in between."""
    per_consumer, delivered, redelivered, others = sort_events_pure(events)
    cut = {
        consumer: delivery_segments_pure(deliveries, bases, stops)
        for consumer, deliveries in per_consumer.items()
    }
    return cut, delivered, redelivered, others


_MODULE = "broky.subscriptions._feed"
#: The compiled twins, when built.
needed_spans_compiled: Callable[[Iterable[list[Event]]], list[tuple[int, int]]] | None = (
    compiled_twin(_MODULE, "needed_spans")
)
event_bounds_compiled: Callable[[Iterable[list[Event]]], tuple[int, int] | None] | None = (
    compiled_twin(_MODULE, "event_bounds")
)
sort_segments_compiled: Callable[[list[Event], list[int], list[int]], SortedSegments] | None = (
    compiled_twin(_MODULE, "sort_segments")
)
needed_spans = needed_spans_compiled or needed_spans_pure
event_bounds = event_bounds_compiled or event_bounds_pure
sort_segments = sort_segments_compiled or sort_segments_pure
