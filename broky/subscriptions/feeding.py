"""Feeding what a partition's round read to one subscription's dispatcher (sans-IO).

Kept apart from broky.subscriptions.partition, which drives the rounds (the
reads, the commits, the deliveries' frames): this is the one decision per
read span of what the dispatcher is given: whole spans when the
subscription takes every key in them, else run by run, and for key-shared
the slot of every message, read from the batch's columns.
"""

from __future__ import annotations

from broky.router.matcher import SubscriptionIndex
from broky.storage.batch_reading import BatchSpan
from broky.storage.topics import sticky_keys
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.model import SubscriptionType
from broky.subscriptions.slots import message_slots, slot_of


def feed_batches(
    dispatcher: Dispatcher,
    matcher: SubscriptionIndex[int] | None,
    spans: list[BatchSpan],
    now: float,
) -> None:
    """Feed ``spans`` (read from ``dispatcher.tracker.read_position``, in
    offset order) to ``dispatcher``: runs whose key ``matcher`` rejects are
    skipped (None: it takes every key). A span whose filter takes every key in it goes whole: shared
    subscriptions queue consecutive spans as one range and deal them at
    once; key-shared ones take the span's slots from its columns in one
    pass (``message_slots``), with no object per run (a stored run is often
    one message long); the other ordered types feed it on slot 0. Otherwise
    run by run: shared subscriptions still queue consecutive runs as one
    range; ordered types take each run's messages, key-shared by each
    message's slot."""
    position = dispatcher.tracker.read_position
    key_shared = dispatcher.options.type is SubscriptionType.KEY_SHARED
    # Shared: consecutive matching runs are queued as one range.
    queued_from = queued_to = position
    for span in spans:
        batch = span.batch
        if matcher is None or all(
            matcher.match(key) for key in batch.keys_between(span.start, span.stop)
        ):
            if key_shared:
                slots = message_slots(batch, span.start, span.stop)
                dispatcher.feed_slots(span.start, slots, now)
                continue
            if dispatcher.ordered:
                dispatcher.feed_slots(span.start, [0] * (span.stop - span.start), now)
                continue
            if span.start != queued_to:
                if queued_to > queued_from:
                    dispatcher.queue(queued_from, queued_to)
                queued_from = span.start
            queued_to = span.stop
            continue
        for run in span.runs():
            offset = run.base_offset
            if matcher is not None and not matcher.match(run.key):
                if queued_to > queued_from:
                    dispatcher.queue(queued_from, queued_to)
                queued_from = queued_to = run.next_offset
                for skipped in range(offset, run.next_offset):
                    dispatcher.skip(skipped)
                continue
            if not dispatcher.ordered:
                if offset != queued_to:
                    if queued_to > queued_from:
                        dispatcher.queue(queued_from, queued_to)
                    queued_from = offset
                queued_to = run.next_offset
                continue
            if not key_shared:
                dispatcher.feed_slots(offset, [0] * run.count, now)
                continue
            sticky = sticky_keys(run.key, run.sizes, run.messages)
            dispatcher.feed_slots(offset, [slot_of(key) for key in sticky], now)
    if not dispatcher.ordered:
        if queued_to > queued_from:
            dispatcher.queue(queued_from, queued_to)
        dispatcher.pump(now)  # deal what ``queue`` took, in slices
