"""The state of a dispatcher and the mechanics that hand messages out.

``DispatchCore`` is the base class of ``Dispatcher`` (in
broky.subscriptions.dispatch, whose docstring states the rules: types,
slots, draining, flow control). It owns the per-slot holds and waiting
lists (ordered types), the ready and retry queues (shared) and the
counters, and does the steps every public call ends in: hand a message or a span to a consumer, take
messages back for redelivery (with the rewind of their slot), dead-letter,
and ``pump`` whatever may go now. Sans-IO: decisions go to ``events``.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import deque
from collections.abc import Sequence

from broky.subscriptions.ack_pass import free_slot, held_after
from broky.subscriptions.model import (
    Consumer,
    DeadLetter,
    Deliver,
    Event,
    Options,
    SubscriptionType,
)
from broky.subscriptions.pending_window import WINDOW_CUT, PendingWindow
from broky.subscriptions.slots import NOBODY, SlotTable
from broky.subscriptions.tracker import AckTracker, Pending, SubscriptionImage


class DispatchCore:
    """A dispatcher's state and delivery mechanics (module docstring)."""

    def __init__(
        self, options: Options, image: SubscriptionImage, end_offset: int = 0, spread: int = 0
    ) -> None:
        if options.type is SubscriptionType.KEY_SHARED and options.ack_timeout <= 0:
            raise ValueError("a key-shared subscription needs an ack timeout > 0")
        self.options = options
        self.ordered = options.type is not SubscriptionType.SHARED
        self.tracker = AckTracker(
            image,
            ack_timeout=options.ack_timeout,
            backoff=options.backoff,
            lease=options.lease,
            end_offset=end_offset,
            ordered=self.ordered,
        )
        self.end_offset = max(end_offset, image.cursor)
        self.consumers: dict[int, Consumer] = {}
        self.events: list[Event] = []
        self.table = SlotTable()
        #: Failover/exclusive: the owner of the one slot.
        self.active = NOBODY
        #: Failover: which of the top-priority consumers is active here (the
        #: partition number, so a subscription's partitions spread over them).
        self.spread = spread
        #: Ordered types: per slot with pending messages, ``[holder, count]``:
        #: the consumer holding them and how many (a slot with none has no
        #: entry, hence no holder). One entry for both, changed in place: a
        #: delivery and an ack each look a slot up once (two dicts, a holder's
        #: and a count's, cost three to four dict operations a message). A
        #: count, not the offsets: the rare question which of them lie past
        #: an offset (a rewind, ``_held_after``) reads the slot window.
        self._holds: dict[int, list[int]] = {}
        #: Ordered types: the slot of each offset read, from ``_window_base``
        #: on (``note_slots``; 0 for the types other than key-shared). An
        #: offset's slot never changes, so it is written once at its read
        #: and the window's front is cut as the cursor passes it
        #: (``trim_window``), where a dict of the pending offsets' slots
        #: cost an insert at each delivery and a delete at each ack. Bound:
        #: reads stop ``max_unacked`` past the cursor, so it holds at most
        #: ``max_unacked + WINDOW_CUT`` entries (a pointer each, the int
        #: objects shared with the read's slot list).
        self._window: list[int] = []
        self._window_base = image.cursor
        #: Ordered types: offsets waiting per slot (parked or due again), sorted.
        self._waiting: dict[int, list[int]] = {}
        self.parked = 0
        #: The next read is a consumer's first (``Dispatcher.wants``: START_READ).
        self.starting = False
        # Shared: offsets due again, by due time, and those due with no room yet.
        self._retry: list[tuple[float, int]] = []
        self._ready: deque[int] = deque()
        self._turn = 0
        self.redelivered = 0
        self.dead_letters = 0
        self.stale_acks = 0

    def _elect(self) -> None:
        if self.options.type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            ranked = sorted(self.consumers.values(), key=lambda c: (-c.priority, c.id))
            if not ranked:
                self.active = NOBODY
                return
            top = [c for c in ranked if c.priority == ranked[0].priority]
            self.active = top[self.spread % len(top)].id

    def owner_of(self, slot: int) -> int:
        if self.options.type is SubscriptionType.KEY_SHARED:
            return self.table.owner(slot)
        return self.active

    def lowest_waiting(self) -> int | None:
        """The lowest offset an ordered type holds back for later (parked,
        or due again), None when none waits: its driver keeps the batches
        read from there on, so a parked message is not read twice."""
        waiting = self._waiting
        return min(offsets[0] for offsets in waiting.values()) if waiting else None

    # --- internals -------------------------------------------------------------------------

    def _slot_waiting(self, offset: int) -> int | None:
        """The slot whose waiting list holds ``offset`` (ordered types)."""
        for slot, waiting in self._waiting.items():
            if offset in waiting:
                return slot
        return None

    def _unwait(self, slot: int, offset: int) -> None:
        waiting = self._waiting[slot]
        waiting.remove(offset)
        self.parked -= 1
        if not waiting:
            del self._waiting[slot]

    def _forget(self, offset: int, pending: Pending) -> int:
        """``offset``'s pending delivery ended (acked, released): free its
        consumer and slot; returns the slot (0 in shared subscriptions)."""
        state = self.consumers.get(pending.consumer)
        if state is not None:
            state.in_flight -= 1
        if not self.ordered:
            return 0
        return free_slot(self._window, self._window_base, self._holds, offset)

    def note_slots(self, first: int, slots: Sequence[int]) -> None:
        """Offsets ``first, first + 1, ...`` were read with ``slots`` (ordered
        types: key-shared's key slots, 0 for the others): the window learns
        the ones past its end. A gap (offsets skipped unread, or acked
        before the read) is filled with slot 0: none of them is delivered."""
        window = self._window
        end = self._window_base + len(window)
        if first > end:
            if not window:
                self._window_base = first
            else:
                window.extend([0] * (first - end))
            end = first
        if first + len(slots) > end:
            if self.options.type is SubscriptionType.KEY_SHARED:
                window.extend(slots[end - first :])
            else:
                window.extend([0] * (first + len(slots) - end))

    def trim_window(self) -> None:
        """Cut the slot window's offsets under the cursor (acked: none is
        pending again), in one cut once they are many (a cut moves the
        rest of the window; the same cut as the pending window's,
        ``WINDOW_CUT``, so both move together)."""
        cursor = self.tracker.cursor
        cut = cursor - self._window_base
        window = self._window
        if cut >= WINDOW_CUT or cut >= len(window) > 0:
            del window[:cut]
            self._window_base += cut
        pending = self.tracker.pending
        if isinstance(pending, PendingWindow):
            pending.trim(cursor)

    def _release(self, offset: int, due: float, error: str = "") -> None:
        """Take ``offset`` back for redelivery at ``due``; in ordered types the
        holder's later messages of the slot come back too (rewind)."""
        tracker = self.tracker
        pending = tracker.release(offset, due, error)
        if pending is None:
            return
        slot = self._forget(offset, pending)
        self.redelivered += 1
        self._requeue(offset, slot, due)
        if self.ordered:
            for other in self._held_after(slot, offset):
                taken = tracker.release(other, due)
                if taken is not None:
                    self._requeue(other, self._forget(other, taken), due)

    def _held_after(self, slot: int, offset: int) -> list[int]:
        """The pending offsets of ``slot`` (an ordered type's) past
        ``offset``, ascending: a scan of the slot window from ``offset``
        on (``ack_pass.held_after``, compiled: about 2 ns an offset), paid
        per rewind (a nack, a timeout, a detach: once per slot, as the
        rewind releases the rest), never on the delivery or ack path.
        Other ordered types than key-shared have every offset on slot 0."""
        if slot not in self._holds:
            return []
        return held_after(self._window, self._window_base, slot, offset, self.tracker.pending)

    def _requeue(self, offset: int, slot: int, due: float) -> None:
        tracker = self.tracker
        tracker.park(offset, due)
        if self.ordered:
            slot = slot if self.options.type is SubscriptionType.KEY_SHARED else 0
            insort(self._waiting.setdefault(slot, []), offset)
            self.parked += 1
        else:
            heapq.heappush(self._retry, (due, offset))

    def _dead_letter(self, offset: int, count: int) -> None:
        self.tracker.due.pop(offset, None)
        self.dead_letters += 1
        self.events.append(DeadLetter(offset, count, self.tracker.errors.get(offset, "")))

    def _try_deliver(self, slot: int, offset: int, now: float) -> bool:
        """Deliver ``offset`` of ``slot`` now if its slot, consumer and gates allow."""
        tracker = self.tracker
        if tracker.due.get(offset, 0.0) > now or not tracker.may_deliver(offset):
            return False
        owner = self.owner_of(slot)
        state = self.consumers.get(owner)
        if state is None or state.room <= 0:
            return False
        hold = self._holds.get(slot)
        if hold is not None and hold[0] != owner:
            return False  # draining: the old owner still holds messages of this slot
        return self._hand(state, offset, slot, now)

    def _hand(self, state: Consumer, offset: int, slot: int, now: float) -> bool:
        """Deliver, or dead-letter once ``max_deliveries`` is spent; True either way."""
        tracker = self.tracker
        count = tracker.count(offset)
        limit = self.options.max_deliveries
        if limit and count >= limit:
            self._dead_letter(offset, count)
            return True
        pending = tracker.deliver(offset, state.id, now)
        if not state.in_flight:
            state.last_progress = now
        state.in_flight += 1
        state.credit -= 1
        if self.ordered:
            self._hold(slot, state.id)
        self.events.append(Deliver(state.id, offset, pending.count, offset + 1))
        return True

    def _hand_fresh(
        self, state: Consumer, offset: int, slot: int, now: float, groups: dict[int, list[int]]
    ) -> None:
        """Deliver never-delivered ``offset`` of ``slot`` (ordered types) to
        ``state``'s consumer, which has room and may hold the slot; the
        caller checked. The tracker learns of it with the consumer's other
        offsets in ``groups`` (``_deliver_groups``: one pending delivery and
        one timer per consumer, not per message), and an offset right after
        the consumer's last delivery event joins that event (one run of one
        frame)."""
        owner = state.id
        group = groups.get(owner)
        if group is None:
            groups[owner] = [offset]
        else:
            group.append(offset)
        if not state.in_flight:
            state.last_progress = now
        state.in_flight += 1
        state.credit -= 1
        self._hold(slot, owner)
        events = self.events
        last = events[-1] if events else None
        if (
            isinstance(last, Deliver)
            and last.stop == offset
            and last.consumer == owner
            and last.count == 1
        ):
            last.stop += 1
        else:
            events.append(Deliver(owner, offset, 1, offset + 1))

    def _hold(self, slot: int, holder: int) -> None:
        """``slot`` holds one more pending offset, held by ``holder``."""
        hold = self._holds.get(slot)
        if hold is None:
            self._holds[slot] = [holder, 1]
        else:
            hold[0] = holder
            hold[1] += 1

    def _deliver_groups(self, groups: dict[int, list[int]], now: float) -> None:
        """Record ``_hand_fresh``'s deliveries with the tracker."""
        for owner, offsets in groups.items():
            offsets.sort()
            self.tracker.deliver_group(offsets, owner, now)

    def pump(self, now: float) -> None:
        """Deliver every waiting message that may go now."""
        if not self.ordered:
            self._pump_shared(now)
            return
        # Only consumers with room can take anything, and none gains room
        # here: the slots of the others are skipped without a look at their
        # messages (pump runs on every ack, grant and commit).
        free = {consumer for consumer, state in self.consumers.items() if state.room > 0}
        if not free:
            return
        # The owner of each waiting slot read straight from the table (as
        # ``feed_slots`` does): this loop visits every waiting slot on every
        # ack and grant, and ``owner_of`` cost two method calls a slot.
        owners = self.table.owners if self.options.type is SubscriptionType.KEY_SHARED else None
        tracker = self.tracker
        counts, due = tracker.counts, tracker.due
        groups: dict[int, list[int]] = {}
        for slot in list(self._waiting):
            owner = self.active if owners is None else owners[slot]
            if owner not in free:
                continue
            state = self.consumers[owner]
            waiting = self._waiting[slot]
            # The slot's offsets go from the front; the ones taken leave
            # in one cut (a front delete each was a shift of the rest).
            taken = 0
            for offset in waiting:
                if (
                    offset not in counts  # parked at its first read: the usual one
                    and offset not in due
                    and offset < tracker.durable_limit
                    and state.credit > 0  # ``state.room > 0``, without the call
                    and state.in_flight < state.max_in_flight
                    and self._holds.get(slot, (owner,))[0] == owner
                ):
                    self._hand_fresh(state, offset, slot, now, groups)
                elif not self._try_deliver(slot, offset, now):
                    break
                taken += 1
            del waiting[:taken]
            self.parked -= taken
            if not waiting:
                del self._waiting[slot]
        self._deliver_groups(groups, now)

    def _pump_shared(self, now: float) -> None:
        tracker = self.tracker
        retry = self._retry
        ready = self._ready
        while retry and retry[0][0] <= now:
            _, offset = heapq.heappop(retry)
            if tracker.due.get(offset) is not None and offset not in tracker.pending:
                ready.append(offset)
        blocked: list[int] = []
        # Each consumer's share of what is ready now is its part of the free
        # room (rounded up): consecutive offsets travel as one run.
        count = len(ready)
        total = sum(max(0, state.room) for state in self.consumers.values())
        counts = tracker.counts
        while ready:
            state = self._next_with_room()
            if state is None:
                break
            share = min(-(-count * state.room // total), state.room)
            while ready and share > 0:
                offset = ready.popleft()
                if offset in tracker.acked or offset in tracker.pending:
                    continue
                if not tracker.may_deliver(offset):
                    blocked.append(offset)
                    continue
                if offset in counts or share == 1:  # a redelivery, a dead letter, or one
                    self._hand(state, offset, 0, now)
                    share -= 1
                    continue
                # Never delivered: it and the never-delivered offsets right
                # after it go as one span (queued reads are such runs).
                stop = offset + 1
                end = min(offset + share, tracker.durable_limit)
                while stop < end and ready and ready[0] == stop and stop not in counts:
                    ready.popleft()
                    stop += 1
                self._hand_span(state, offset, stop, now)
                share -= stop - offset
        ready.extendleft(reversed(blocked))

    def _hand_span(self, state: Consumer, first: int, stop: int, now: float) -> None:
        """Deliver the never-delivered offsets ``[first, stop)`` as one span."""
        self.tracker.deliver_span(first, stop, state.id, now)
        if not state.in_flight:
            state.last_progress = now
        taken = stop - first
        state.in_flight += taken
        state.credit -= taken
        self.events.append(Deliver(state.id, first, 1, stop))

    def _next_with_room(self) -> Consumer | None:
        consumers: Sequence[Consumer] = list(self.consumers.values())
        for step in range(len(consumers)):
            state = consumers[(self._turn + step) % len(consumers)]
            if state.room > 0:
                self._turn = (self._turn + step + 1) % len(consumers)
                return state
        return None
