"""Types of the compiled twins of ``broky.subscriptions.ack_pass``'s pure functions."""

from broky.subscriptions.ack_pass import FreeSlots, MergeAcked, TakeAcked

take_acked: TakeAcked
merge_acked: MergeAcked
free_slots: FreeSlots
