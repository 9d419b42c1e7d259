"""The dispatcher of one (subscription, partition): who gets which message (sans-IO).

One dispatcher per (subscription, partition), owned by whoever owns the
partition, driven synchronously: every call decides and records at once
("choose consumer, record pending, emit delivery" is one step with no await
inside, the property whose absence broke Pulsar's key-shared ordering,
#20179/#21953/#23307). Decisions come out as events (:class:`Deliver`,
:class:`DeadLetter`, :class:`Evict`) in ``events``, for the driver to carry
out; ``now`` is passed in (seconds).

Types:

- ``shared``: each message to a consumer with room (consumers taken in
  round-robin order); no order between messages. A read queued with
  ``queue`` is dealt by ``pump`` in consecutive slices, each consumer's its
  part of the free room, so a consumer's messages travel as runs and its
  acks as ranges.
- ``exclusive`` / ``failover`` / ``key-shared`` are *ordered*: every message
  belongs to a slot (key-shared: the key's slot; the others: one slot), a slot
  has one owner, and the invariant of PIP-379 holds: **all unacked messages of
  a slot are at one consumer at a time**. A slot whose owner changed while the
  old owner still holds some of its messages is *draining*: its messages wait
  (parked, by offset) until the old holder acked them, released them, timed out
  or left; other slots keep flowing. When a message is redelivered (nack,
  timeout), the later messages of its slot that the same consumer holds are
  taken back too and redelivered after it, in offset order: a consumer sees
  ``n, n+1, ⟲ n, n+1``, never ``n+1, n``.
- ``failover``: the owner of the one slot is one of the consumers with the
  highest priority: ranked by attach order, the one at ``spread`` (the
  partition number) modulo their count, so a subscription's partitions are
  spread over its consumers, as Pulsar does, instead of all going to the
  first (``exclusive`` has one consumer); a switch waits for the old one to
  drain, never a blind delay (Pulsar #749/#6535).

Flow control: a consumer receives while it has credit (granted by the
client, one message each) and fewer than ``max_in_flight`` unacked messages.
A consumer without room is skipped; in ordered types only its slots wait.
"""

from __future__ import annotations

import itertools
from bisect import insort
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from broky.compiled import compiled_twin
from broky.subscriptions.dispatch_core import DispatchCore
from broky.subscriptions.model import (
    Consumer,
    Evict,
    SubscriptionBusy,
    SubscriptionType,
)
from broky.subscriptions.slots import NOBODY
from broky.subscriptions.tracker import (
    SubscriptionImage,
    backoff_delay,
)

#: At most this many new offsets are read in the first read after a
#: consumer attached: the first deliveries go out after a small read and
#: feed instead of after every partition read and fed its consumers' whole
#: credit (~4,000 messages each for a key-shared subscription over 8
#: partitions, ~100 ms before the first message reached anyone); the next
#: round, woken by this one's progress, reads the rest. Only that read:
#: capping every read with nothing in flight also cut the reads of
#: consumers that ack all they hold between two rounds (more, smaller
#: rounds).
START_READ: Final = 1024

#: The compiled fresh-read loop of a key-shared ``feed_slots``, when built.
feed_fresh_compiled: Callable[[Dispatcher, int, list[int], float], None] | None = compiled_twin(
    "broky.subscriptions._feed", "feed_fresh"
)


class Dispatcher(DispatchCore):
    """See the module docstring; the state and the delivery mechanics are
    ``DispatchCore``'s (broky.subscriptions.dispatch_core)."""

    # --- consumers ------------------------------------------------------------------------

    def attach(
        self,
        consumer: int,
        now: float,
        *,
        credit: int,
        max_in_flight: int,
        priority: int = 0,
        state: Consumer | None = None,
    ) -> None:
        """Add a consumer. ``state``: a :class:`Consumer` shared with the
        dispatchers of the subscription's other partitions, so that its
        credit and ``max_in_flight`` bound the consumer as a whole, not each
        partition (then ``credit``, ``max_in_flight`` and ``priority`` are
        the state's)."""
        kind = self.options.type
        if kind is SubscriptionType.EXCLUSIVE and self.consumers:
            raise SubscriptionBusy("the exclusive subscription already has a consumer")
        if state is None:
            state = Consumer(consumer, priority, credit, max_in_flight, 0, now)
        self.consumers[consumer] = state
        self.starting = True
        if kind is SubscriptionType.KEY_SHARED:
            self.table.join(consumer)
        self._elect()
        self.pump(now)

    def detach(self, consumer: int, now: float) -> None:
        """The consumer closed, disconnected or was evicted: what it holds is due now."""
        gone = self.consumers.pop(consumer, None)
        if gone is None:
            return
        if self.options.type is SubscriptionType.KEY_SHARED:
            self.table.leave(consumer)
        held = sorted(o for o, p in self.tracker.pending.items() if p.consumer == consumer)
        for offset in held:
            self._release(offset, now)
        self._elect()
        self.pump(now)

    def grant(self, consumer: int, credit: int, now: float) -> None:
        state = self.consumers.get(consumer)
        if state is not None:
            state.credit += credit
            self.pump(now)

    # --- reading new offsets ----------------------------------------------------------

    def wants(self) -> int:
        """How many new offsets (from ``tracker.read_position``) to read and
        ``feed``: START_READ at most the first time it is not 0 after an attach."""
        tracker = self.tracker
        tracker.want_lease()
        options = self.options
        if len(tracker.acked) >= options.max_ack_ranges:
            return 0
        if tracker.read_position - tracker.cursor >= options.max_unacked:
            return 0
        available = min(self.end_offset, tracker.durable_limit) - tracker.read_position
        if available <= 0:
            return 0
        room = sum(max(0, c.room) for c in self.consumers.values())
        if self.ordered:
            # Messages for busy or draining slots park (offsets only); the
            # bound stops the read, never another slot's delivery.
            if self.parked >= options.max_parked:
                return 0
        else:
            room -= len(self._ready)
        wanted = max(0, min(available, room))
        if self.starting and wanted:
            self.starting = False
            return min(wanted, START_READ)
        return wanted

    def _take_read(self, offset: int) -> bool:
        """Move the read position over ``offset``; whether it is to deliver."""
        tracker = self.tracker
        if offset < tracker.read_position:
            return False  # read twice (a read raced a rewind); the first one counts
        tracker.skip_read(offset)
        return not (offset in tracker.acked or offset in tracker.pending)

    def feed(self, offset: int, slot: int, now: float) -> None:
        """A message read from ``tracker.read_position``, in offset order."""
        if self.ordered:
            self.feed_slots(offset, (slot,), now)
        elif self._take_read(offset):
            self._ready.append(offset)
            self._pump_shared(now)

    def feed_slots(self, first: int, slots: Sequence[int], now: float) -> None:
        """Messages ``first, first + 1, ...`` read from ``tracker.read_position``
        for an ordered type, ``slots`` their slots (key-shared; the others
        use slot 0 whatever is given).

        Why a batch: a key-shared subscription over keys that change on
        every message runs this per message, so the usual case (never
        delivered, its slot's owner has room, nothing of the slot waiting)
        is decided here inline and handed out by ``_hand_fresh``: each
        consumer's offsets become one pending delivery, consecutive ones
        one :class:`Deliver`. A key-shared dispatcher's fresh read (the
        usual one) runs this loop compiled when it is built
        (``broky.subscriptions._feed.feed_fresh``, the same decisions and
        state, held equal by ``tests/subscriptions/test_passes.py``)."""
        assert self.ordered
        self.note_slots(first, slots)
        tracker = self.tracker
        counts, due = tracker.counts, tracker.due
        # Read right at the position with nothing acked ahead: no offset
        # here is acked or pending (deliveries never pass the read position).
        fresh = first == tracker.read_position and not tracker.acked.reaches(first)
        key_shared = self.options.type is SubscriptionType.KEY_SHARED
        if fresh and key_shared and feed_fresh_compiled is not None and slots:
            feed_fresh_compiled(self, first, list(slots), now)
            return
        owners = self.table.owners if key_shared else None
        consumers, holds, waiting_by_slot = self.consumers, self._holds, self._waiting
        limit = tracker.durable_limit
        groups: dict[int, list[int]] = {}
        for offset, given in enumerate(slots, first):
            if not fresh:
                if not self._take_read(offset):
                    continue
            elif offset >= tracker.read_position:
                tracker.read_position = offset + 1
            slot = given if key_shared else 0
            waiting = waiting_by_slot.get(slot)
            if waiting:
                insort(waiting, offset)
                self.parked += 1
                continue
            if offset not in counts and offset not in due and offset < limit:
                owner = self.active if owners is None else owners[slot]
                state = consumers.get(owner)
                if (
                    state is not None
                    and state.credit > 0
                    and state.in_flight < state.max_in_flight
                    and holds.get(slot, (owner,))[0] == owner
                ):
                    self._hand_fresh(state, offset, slot, now, groups)
                    continue
            if not self._try_deliver(slot, offset, now):
                waiting_by_slot[slot] = [offset]
                self.parked += 1
        self._deliver_groups(groups, now)

    def queue(self, first: int, stop: int) -> None:
        """Messages ``[first, stop)`` read in offset order, for a shared
        subscription: queued only; ``pump`` after the read deals them at
        once, so each consumer gets a consecutive slice (one run of one
        Deliver frame, acked back as one range) instead of every n-th
        message, as ``feed`` one by one would."""
        assert not self.ordered
        tracker = self.tracker
        if first == tracker.read_position and not tracker.acked.reaches(first):
            # The common case, read right at the position with nothing acked
            # ahead of it: nothing to check per offset.
            self._ready.extend(range(first, stop))
            tracker.skip_read(stop - 1)
            return
        ready = self._ready
        for offset in range(first, stop):
            if self._take_read(offset):
                ready.append(offset)

    def skip(self, offset: int) -> None:
        """An offset read from ``tracker.read_position`` that this subscription
        does not take (its key is outside the subscription's pattern): acked
        without a delivery, so the cursor moves over it."""
        if offset >= self.tracker.read_position:
            self.tracker.ack_unread(offset)

    # --- acknowledgements ---------------------------------------------------------------

    def ack_ranges(self, consumer: int, ranges: Iterable[Sequence[int]], now: float) -> int:
        """:meth:`ack` of a settle's offsets, given as its ranges: the parts
        of a range that fall on span deliveries of a shared subscription
        (``AckTracker.ack_spans``) are acked a span piece at a time, the
        rest offset by offset."""
        if self.ordered:
            return self.ack(consumer, itertools.chain.from_iterable(ranges), now)
        freed: dict[int, int] = {}
        rest: list[Sequence[int]] = []
        ack_spans = self.tracker.ack_spans
        for offsets in ranges:
            if not isinstance(offsets, range) or offsets.step != 1:
                rest.append(offsets)
                continue
            ended, stopped = ack_spans(offsets)
            for held, count in ended:
                freed[held.consumer] = freed.get(held.consumer, 0) + count
            if stopped < offsets.stop:
                rest.append(range(stopped, offsets.stop))
        return self.ack(consumer, itertools.chain.from_iterable(rest), now, freed)

    def ack(
        self, consumer: int, offsets: Iterable[int], now: float, freed: dict[int, int] | None = None
    ) -> int:
        """Ack ``offsets`` (those never delivered, or acked already, are
        skipped); returns how many were stale (held by another consumer or
        already taken back: accepted anyway, the work was done). ``freed``:
        deliveries per holder that the caller ended already
        (:meth:`ack_ranges`), counted in with the ones these offsets end."""
        stale = 0
        state = self.consumers.get(consumer)
        if state is not None:
            state.last_progress = now
        # Ordered types free each ended offset's slot in the same pass
        # (``_forget`` for all of them: a key-shared consumer acks
        # scattered offsets).
        slots = (self._window, self._window_base, self._holds) if self.ordered else None
        _, lost, waiting = self.tracker.ack_delivered(offsets, slots)
        if self.ordered:
            self.trim_window()
        for offset in waiting:
            slot = self._slot_waiting(offset)
            if slot is not None:
                self._unwait(slot, offset)
                stale += 1
        # Each holder's in-flight count drops once per holder, not per offset.
        freed = {} if freed is None else freed
        for pending, count in lost.items():
            freed[pending.consumer] = freed.get(pending.consumer, 0) + count
        for holder, count in freed.items():
            if holder != consumer:
                stale += count
            held_by = self.consumers.get(holder)
            if held_by is not None:
                held_by.in_flight -= count
        self.stale_acks += stale
        self.pump(now)
        return stale

    def nack(
        self,
        consumer: int,
        offsets: Iterable[int],
        now: float,
        delay: float | None,
        error: str = "",
    ) -> None:
        """Redeliver after ``delay`` (None: the backoff schedule); stale nacks are ignored."""
        tracker = self.tracker
        state = self.consumers.get(consumer)
        if state is not None:
            state.last_progress = now
        for offset in offsets:
            pending = tracker.pending.get(offset)
            if pending is None or pending.consumer != consumer:
                continue
            wait = backoff_delay(tracker.backoff, pending.count) if delay is None else delay
            self._release(offset, now + wait, error)
        self.pump(now)

    def term(self, consumer: int, offsets: Iterable[int], now: float, reason: str) -> None:
        """Dead-letter at once."""
        tracker = self.tracker
        for offset in offsets:
            pending = tracker.pending.get(offset)
            if pending is None or pending.consumer != consumer:
                continue
            tracker.errors[offset] = reason
            tracker.release(offset, now, reason)
            self._forget(offset, pending)
            self._dead_letter(offset, pending.count)
        self.pump(now)

    def dead_lettered(self, offsets: Iterable[int], now: float) -> None:
        """The dead-letter topic durably holds ``offsets``: ack them here."""
        self.ack(NOBODY, offsets, now)

    def in_progress(self, consumer: int, offsets: Iterable[int], now: float) -> None:
        state = self.consumers.get(consumer)
        if state is not None:
            state.last_progress = now
        for offset in offsets:
            self.tracker.extend(offset, consumer, now)

    # --- time ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Time passed: expire ack deadlines, evict stuck consumers, deliver what is due."""
        tracker = self.tracker
        for offset, pending in list(tracker.expired(now)):
            wait = backoff_delay(tracker.backoff, pending.count)
            self._release(offset, now + wait, "ack timeout")
        evict_after = 2 * self.options.ack_timeout
        if self.ordered and evict_after > 0:
            for state in list(self.consumers.values()):
                if state.in_flight and now - state.last_progress >= evict_after:
                    self.events.append(Evict(state.id))
                    self.detach(state.id, now)
        self.pump(now)

    def next_wake(self) -> float | None:
        """When ``tick`` has something to do (None: only on other events)."""
        times = [t for t in (self.tracker.next_deadline(),) if t is not None]
        if self._retry:
            times.append(self._retry[0][0])
        due = self.tracker.due
        times.extend(due[w[0]] for w in self._waiting.values() if w and w[0] in due)
        return min(times) if times else None

    def committed(self, image: SubscriptionImage, now: float) -> None:
        """``image`` (from ``tracker.image()``) is durable: deliveries it gates may go."""
        self.tracker.committed(image)
        self.pump(now)
