"""Types of the compiled twins of ``broky.subscriptions.ack_pass``'s pure
functions and of ``broky.subscriptions.slots.assign_pure``."""

from broky.subscriptions.ack_pass import FreeSlots, MergeAcked, TakeAcked

take_acked: TakeAcked
merge_acked: MergeAcked
free_slots: FreeSlots

def assign(owners: list[int], slots: list[int], owner: int) -> None: ...
