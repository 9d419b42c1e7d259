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
from broky.subscriptions.model import DeadLetter, Deliver, Event

#: Per consumer, its deliveries ``(first, stop, delivery count)`` in decision order.
PerConsumer = dict[int, list[tuple[int, int, int]]]
Sorted = tuple[PerConsumer, int, int, list[Event]]


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


_MODULE = "broky.subscriptions._feed"
#: The compiled twins, when built.
needed_spans_compiled: Callable[[Iterable[list[Event]]], list[tuple[int, int]]] | None = (
    compiled_twin(_MODULE, "needed_spans")
)
sort_events_compiled: Callable[[list[Event]], Sorted] | None = compiled_twin(_MODULE, "sort_events")
needed_spans = needed_spans_compiled or needed_spans_pure
sort_events = sort_events_compiled or sort_events_pure
