"""Types of the compiled twins of ``broky.subscriptions.ack_pass``'s pure
functions, of ``broky.subscriptions.slots.assign_pure`` and of
``broky.subscriptions.settle_ranges.gather_ranges_pure`` and of
``broky.subscriptions.delivery.delivery_segments_pure``, of
``broky.subscriptions.round_events``' passes, and the compiled
fresh-read loop of ``Dispatcher.feed_slots``."""

from collections.abc import Iterable

from broky.subscriptions.ack_pass import MergeAcked, TakeAcked
from broky.subscriptions.delivery import DeliverySegments
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.model import Event
from broky.subscriptions.round_events import Sorted
from broky.subscriptions.settle_ranges import GatherRanges

take_acked: TakeAcked
merge_acked: MergeAcked

def assign(owners: list[int], slots: list[int], owner: int) -> None: ...

gather_ranges: GatherRanges
delivery_segments: DeliverySegments

def span_bounds(spans: list[tuple[int, int]]) -> tuple[int, int]: ...
def feed_fresh(dispatcher: Dispatcher, first: int, slots: list[int], now: float) -> None: ...
def needed_spans(batches: Iterable[list[Event]]) -> list[tuple[int, int]]: ...
def sort_events(events: list[Event]) -> Sorted: ...
