"""Types of the compiled fresh-read loop of ``Dispatcher.feed_slots`` and of
the compiled twins of ``broky.subscriptions.round_events``' passes."""

from collections.abc import Iterable

from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.model import Event
from broky.subscriptions.round_events import Sorted

def feed_fresh(dispatcher: Dispatcher, first: int, slots: list[int], now: float) -> None: ...
def needed_spans(batches: Iterable[list[Event]]) -> list[tuple[int, int]]: ...
def sort_events(events: list[Event]) -> Sorted: ...
