"""Any interleaving of publish, attach, detach, credit, read, ack (current or
stale), nack, term, in_progress, time, commit and broker crash keeps the
dispatcher's promises:

- a receipted ack (acked before a commit that finished) is never delivered again;
- ``delivery_count`` is never below the number of times the offset was handed out,
  and exceeds it by at most one per crash;
- ordered types: all unacked messages of a slot are at one consumer, and when a
  message is delivered every earlier message of its slot is acked, dead-lettered
  or held by the same consumer (per-key order, rewinds included);
- nothing unacked is lost: at the end a consumer with credit drains everything.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.model import (
    DeadLetter,
    Deliver,
    Evict,
    Options,
    SubscriptionBusy,
    SubscriptionType,
)
from broky.subscriptions.tracker import SubscriptionImage

KEYS = 6
Backoff = tuple[float, ...]
TYPES = list(SubscriptionType)


def slot_of_key(key: int) -> int:
    return (key * 16411) % 65536


class DispatcherMachine(RuleBasedStateMachine):
    @initialize(
        kind=st.sampled_from(TYPES),
        max_deliveries=st.sampled_from([0, 2, 4]),
        backoff=st.sampled_from([(), (0.5, 2.0)]),
    )
    def setup(self, kind: SubscriptionType, max_deliveries: int, backoff: Backoff) -> None:
        self.start(kind, max_deliveries, backoff)

    def start(self, kind: SubscriptionType, max_deliveries: int, backoff: Backoff) -> None:
        self.options = Options(
            type=kind,
            ack_timeout=5.0,
            backoff=backoff,
            max_deliveries=max_deliveries,
            max_parked=50,
            lease=8,
        )
        self.now = 0.0
        self.keys: list[int] = []
        self.disk = SubscriptionImage(0)
        self.dispatcher = Dispatcher(self.options, self.disk)
        self.next_consumer = 1
        self.deliveries: Counter[int] = Counter()
        self.last_count: dict[int, int] = {}
        self.crashes_since: Counter[int] = Counter()
        self.receipted: set[int] = set()
        self.acked_since_commit: set[int] = set()
        self.delivered_to: dict[int, list[int]] = {}
        self.dead: list[int] = []
        self.dead_done: set[int] = set()
        for _ in range(1 if kind is SubscriptionType.EXCLUSIVE else 2):
            self.attach(credit=8, max_in_flight=6, priority=0)
        self.commit()  # the first lease: publishes are delivered at once

    # --- helpers ---------------------------------------------------------------------

    def slot(self, offset: int) -> int:
        return slot_of_key(self.keys[offset])

    def take_events(self) -> None:
        dispatcher = self.dispatcher
        events, dispatcher.events = dispatcher.events, []
        # A span is its offsets delivered one after the other.
        events = [
            Deliver(e.consumer, offset, e.count, offset + 1) if isinstance(e, Deliver) else e
            for e in events
            for offset in (range(e.offset, e.stop) if isinstance(e, Deliver) else (0,))
        ]
        later_in_batch = Counter(e.offset for e in events if isinstance(e, Deliver))
        for event in events:
            if isinstance(event, Deliver):
                later_in_batch[event.offset] -= 1
                offset = event.offset
                assert offset not in self.receipted, f"receipted ack {offset} delivered again"
                self.deliveries[offset] += 1
                assert event.count >= self.deliveries[offset]
                assert event.count <= self.deliveries[offset] + self.crashes_since[offset]
                self.delivered_to.setdefault(event.consumer, []).append(offset)
                self.check_order(event, {o for o, n in later_in_batch.items() if n > 0})
            elif isinstance(event, DeadLetter):
                assert self.options.max_deliveries == 0 or event.count >= 1
                self.dead.append(event.offset)
            elif isinstance(event, Evict):
                self.delivered_to.pop(event.consumer, None)

    def check_order(self, event: Deliver, delivered_after: set[int]) -> None:
        dispatcher = self.dispatcher
        if not dispatcher.ordered:
            return
        tracker = dispatcher.tracker
        pending = tracker.pending.get(event.offset)
        if pending is None or pending.consumer != event.consumer:
            return
        keyed = self.options.type is SubscriptionType.KEY_SHARED
        for later, held in tracker.pending.items():
            if later in delivered_after:
                continue
            if later > event.offset and (not keyed or self.slot(later) == self.slot(event.offset)):
                assert held.consumer != event.consumer, (
                    f"{event.offset} redelivered to {event.consumer} behind {later} (no rewind)"
                )
        for earlier in range(tracker.cursor, event.offset):
            if keyed and self.slot(earlier) != self.slot(event.offset):
                continue
            if earlier in tracker.acked or earlier in self.dead:
                continue
            holder = tracker.pending.get(earlier)
            assert holder is not None, f"{event.offset} delivered before {earlier}"
            assert holder.consumer == event.consumer, (
                f"{event.offset} delivered to {event.consumer} before {earlier}"
            )

    # --- rules ---------------------------------------------------------------------------

    @rule(keys=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=8))
    def publish(self, keys: list[int]) -> None:
        self.keys.extend(keys)
        self.dispatcher.end_offset = len(self.keys)
        self.read()

    @rule(credit=st.integers(0, 12), max_in_flight=st.integers(1, 8), priority=st.integers(0, 1))
    def attach(self, credit: int, max_in_flight: int, priority: int) -> None:
        consumer = self.next_consumer
        self.next_consumer += 1
        try:
            self.dispatcher.attach(
                consumer, self.now, credit=credit, max_in_flight=max_in_flight, priority=priority
            )
        except SubscriptionBusy:
            assert self.options.type is SubscriptionType.EXCLUSIVE
            return
        self.delivered_to[consumer] = []
        self.take_events()

    @precondition(lambda self: self.dispatcher.consumers)
    @rule(data=st.data())
    def detach(self, data: st.DataObject) -> None:
        consumer = data.draw(st.sampled_from(sorted(self.dispatcher.consumers)))
        self.dispatcher.detach(consumer, self.now)
        self.delivered_to.pop(consumer, None)
        self.take_events()

    @precondition(lambda self: self.dispatcher.consumers)
    @rule(data=st.data(), credit=st.integers(1, 12))
    def grant(self, data: st.DataObject, credit: int) -> None:
        consumer = data.draw(st.sampled_from(sorted(self.dispatcher.consumers)))
        self.dispatcher.grant(consumer, credit, self.now)
        self.take_events()

    @rule()
    def commit_and_read(self) -> None:
        self.commit()
        self.read()

    def read(self) -> None:
        dispatcher = self.dispatcher
        wanted = dispatcher.wants()
        start = dispatcher.tracker.read_position
        stop = min(start + wanted, len(self.keys))
        if dispatcher.ordered:
            # As the driver does: a read's slots at once (``feed_slots``
            # groups each consumer's offsets into one delivery).
            slots = [self.slot(offset) for offset in range(start, stop)]
            dispatcher.feed_slots(start, slots, self.now)
        else:
            # As the driver does: queue the whole read, then deal it in slices.
            dispatcher.queue(start, stop)
            dispatcher.pump(self.now)
        self.take_events()

    def delivered_offsets(self, data: st.DataObject) -> tuple[int, list[int]] | None:
        candidates = [c for c, offsets in sorted(self.delivered_to.items()) if offsets]
        if not candidates:
            return None
        consumer = data.draw(st.sampled_from(candidates))
        held = sorted(
            o for o, p in self.dispatcher.tracker.pending.items() if p.consumer == consumer
        )
        # Mostly what the consumer holds now; sometimes anything it ever got (stale).
        stale = data.draw(st.integers(0, 3)) == 0
        pool = self.delivered_to[consumer] if stale or not held else held
        offsets = data.draw(st.lists(st.sampled_from(pool), max_size=4))
        return consumer, offsets

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        picked = self.delivered_offsets(data)
        if picked is None:
            return
        consumer, offsets = picked
        self.dispatcher.ack(consumer, offsets, self.now)
        self.acked_since_commit.update(o for o in offsets if o in self.dispatcher.tracker.acked)
        self.take_events()

    @rule(data=st.data())
    def ack_ranges(self, data: st.DataObject) -> None:
        """A settle as a client sends it: all the consumer holds, or some
        offsets it got, as ranges of consecutive offsets (whole spans are
        acked in one step, ``AckTracker.ack_spans``)."""
        picked = self.delivered_offsets(data)
        if picked is None:
            return
        consumer, offsets = picked
        tracker = self.dispatcher.tracker
        if data.draw(st.booleans()):
            offsets = [o for o, p in tracker.pending.items() if p.consumer == consumer]
        ranges: list[range] = []
        for offset in sorted(set(offsets)):
            if ranges and ranges[-1].stop == offset:
                ranges[-1] = range(ranges[-1].start, offset + 1)
            else:
                ranges.append(range(offset, offset + 1))
        self.dispatcher.ack_ranges(consumer, ranges, self.now)
        self.acked_since_commit.update(o for o in offsets if o in tracker.acked)
        self.take_events()

    @rule(data=st.data(), delay=st.sampled_from([None, 0.0, 1.0]))
    def nack(self, data: st.DataObject, delay: float | None) -> None:
        picked = self.delivered_offsets(data)
        if picked is None:
            return
        consumer, offsets = picked
        self.dispatcher.nack(consumer, offsets, self.now, delay, "nacked")
        self.take_events()

    @rule(data=st.data(), delay=st.sampled_from([None, 0.0]))
    def nack_first_held(self, data: st.DataObject, delay: float | None) -> None:
        """Nack the oldest message of a consumer that holds later ones too (a rewind)."""
        held: dict[int, list[int]] = {}
        for offset, pending in sorted(self.dispatcher.tracker.pending.items()):
            held.setdefault(pending.consumer, []).append(offset)
        candidates = sorted(c for c, offsets in held.items() if len(offsets) >= 2)
        if not candidates:
            return
        consumer = data.draw(st.sampled_from(candidates))
        self.dispatcher.nack(consumer, held[consumer][:1], self.now, delay, "rewind")
        self.take_events()

    @rule(data=st.data())
    def term(self, data: st.DataObject) -> None:
        picked = self.delivered_offsets(data)
        if picked is None:
            return
        consumer, offsets = picked
        self.dispatcher.term(consumer, offsets[:1], self.now, "poison")
        self.take_events()

    @rule(data=st.data())
    def in_progress(self, data: st.DataObject) -> None:
        picked = self.delivered_offsets(data)
        if picked is None:
            return
        consumer, offsets = picked
        self.dispatcher.in_progress(consumer, offsets, self.now)

    @rule()
    def finish_dead_letters(self) -> None:
        todo = [o for o in self.dead if o not in self.dead_done]
        self.dead_done.update(todo)
        self.dispatcher.dead_lettered(todo, self.now)
        self.acked_since_commit.update(todo)
        self.take_events()

    @rule(seconds=st.sampled_from([0.1, 1.0, 2.0, 5.5, 11.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.dispatcher.tick(self.now)
        self.take_events()

    @rule()
    def commit(self) -> None:
        image = self.dispatcher.tracker.image()
        self.disk = image
        self.receipted |= {o for o in self.acked_since_commit if o in self.dispatcher.tracker.acked}
        self.acked_since_commit.clear()
        self.dispatcher.committed(image, self.now)
        self.take_events()

    @rule()
    def crash(self) -> None:
        for offset in range(self.disk.cursor, min(self.disk.limit, len(self.keys))):
            self.crashes_since[offset] += 1
        self.dispatcher = Dispatcher(self.options, self.disk, len(self.keys))
        self.delivered_to.clear()
        self.acked_since_commit.clear()
        self.dead = [o for o in self.dead if o in self.receipted]
        self.dead_done = set(self.dead)

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def one_holder_per_slot(self) -> None:
        dispatcher = self.dispatcher
        if not dispatcher.ordered:
            return
        keyed = self.options.type is SubscriptionType.KEY_SHARED
        holders: dict[int, set[int]] = {}
        for offset, pending in dispatcher.tracker.pending.items():
            holders.setdefault(self.slot(offset) if keyed else 0, set()).add(pending.consumer)
        assert all(len(h) == 1 for h in holders.values()), holders

    @invariant()
    def slot_window_holds_every_pending_slot(self) -> None:
        """The slot window (``DispatchCore.note_slots``) gives each pending
        offset of an ordered type its slot: an ack frees that slot, a
        take-back rewinds it."""
        dispatcher = self.dispatcher
        if not dispatcher.ordered:
            return
        keyed = self.options.type is SubscriptionType.KEY_SHARED
        window, base = dispatcher._window, dispatcher._window_base
        for offset in dispatcher.tracker.pending:
            assert 0 <= offset - base < len(window), (offset, base, len(window))
            assert window[offset - base] == (self.slot(offset) if keyed else 0)

    @invariant()
    def held_counts_are_the_pending_offsets_of_each_slot(self) -> None:
        """Each slot's hold (``DispatchCore._holds``: ``[holder, count]``, an
        ack takes one off, a slot at none loses its entry) counts the
        offsets of it that are pending and names the consumer they are
        pending with; the slots holding none have no entry."""
        dispatcher = self.dispatcher
        if not dispatcher.ordered:
            return
        keyed = self.options.type is SubscriptionType.KEY_SHARED
        per_slot: Counter[int] = Counter()
        holder_of: dict[int, int] = {}
        for offset, pending in dispatcher.tracker.pending.items():
            slot = self.slot(offset) if keyed else 0
            per_slot[slot] += 1
            holder_of[slot] = pending.consumer
        assert {slot: hold[1] for slot, hold in dispatcher._holds.items()} == dict(per_slot)
        assert {slot: hold[0] for slot, hold in dispatcher._holds.items()} == holder_of

    @invariant()
    def in_flight_matches_pending(self) -> None:
        dispatcher = self.dispatcher
        held = Counter(p.consumer for p in dispatcher.tracker.pending.values())
        for consumer in dispatcher.consumers.values():
            assert consumer.in_flight == held[consumer.id]
            assert consumer.in_flight <= consumer.max_in_flight
            assert consumer.credit >= 0  # slices never exceed the room

    @invariant()
    def balanced_slots(self) -> None:
        low, high = self.dispatcher.table.spread()
        assert high - low <= 1

    def teardown(self) -> None:
        """Nothing unacked is lost: one consumer with credit drains everything."""
        if not hasattr(self, "dispatcher"):
            return
        dispatcher = self.dispatcher
        for consumer in list(dispatcher.consumers):
            dispatcher.detach(consumer, self.now)
        self.take_events()
        dispatcher.attach(999, self.now, credit=10**6, max_in_flight=10**6)
        self.delivered_to[999] = []
        for _ in range(60):
            self.commit()
            self.read()
            self.finish_dead_letters()
            while self.delivered_to[999]:
                offsets = self.delivered_to[999]
                self.delivered_to[999] = []
                dispatcher.ack(999, offsets, self.now)
                self.take_events()
                self.finish_dead_letters()
            if dispatcher.tracker.cursor == len(self.keys):
                break
            self.now += 200.0
            dispatcher.tick(self.now)
            self.take_events()
            assert 999 in dispatcher.consumers, "evicted while acking everything"
        assert dispatcher.tracker.cursor == len(self.keys), (
            f"stuck at {dispatcher.tracker.cursor} of {len(self.keys)}"
        )


DispatcherMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=50,
    deadline=None,
    # The explain phase traces every line: far too slow over 65,536 slots.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
TestDispatcher = DispatcherMachine.TestCase


class KeySharedMachine(DispatcherMachine):
    """Key-shared only, with generous credit: slots move while messages are out."""

    @initialize(max_deliveries=st.sampled_from([0, 3]), backoff=st.sampled_from([(), (0.5,)]))
    def setup(self, max_deliveries: int, backoff: Backoff) -> None:
        self.start(SubscriptionType.KEY_SHARED, max_deliveries, backoff)


KeySharedMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=50,
    deadline=None,
    # The explain phase traces every line: far too slow over 65,536 slots.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
TestKeyShared = KeySharedMachine.TestCase
