"""Types of the compiled twins of ``broky.subscriptions.ack_pass``'s pure
functions, of ``broky.subscriptions.slots.assign_pure``, of
``broky.subscriptions.settle_ranges.gather_ranges_pure`` and of
``broky.subscriptions.delivery``'s ``delivery_segments_pure`` and
``span_bounds_pure``, and of ``broky.subscriptions.image.put_pairs_pure``."""

from broky.subscriptions.ack_pass import HeldAfter, MergeAcked, TakeAcked
from broky.subscriptions.delivery import DeliverySegments
from broky.subscriptions.image import PutPairs
from broky.subscriptions.settle_ranges import GatherRanges

take_acked: TakeAcked
merge_acked: MergeAcked
held_after: HeldAfter

def assign(owners: list[int], slots: list[int], owner: int) -> None: ...

gather_ranges: GatherRanges
delivery_segments: DeliverySegments

def span_bounds(spans: list[tuple[int, int]]) -> tuple[int, int]: ...

put_pairs: PutPairs
