"""What a subscription knows about each offset of one partition (sans-IO).

The tracker owns the per-offset facts of one (subscription, partition): which
offsets are acked (a *cursor* below which everything is acked, plus disjoint
ranges above it), how often each unacked offset was delivered, which
consumer holds it now and until when (pending, with an ack deadline), and
when a released offset is due again. It decides nothing about *who* gets a
message; that is the dispatcher's job (``dispatch.py``). No I/O, no clock: the
caller passes ``now`` (seconds, any monotonic origin).

Crash rule. The durable image (:class:`SubscriptionImage`) holds the cursor,
the acked ranges, a *limit* and the delivery counts of offsets that may have
been delivered more than once. After a restart every unacked offset below the
limit is taken as delivered once more than recorded (``count = recorded +
1``). So that this never *under*-counts (a poison message must not loop
forever across crashes), two gates hold before any delivery:

- a new offset is delivered only below the committed limit (the limit is
  leased ahead of the read position, ``lease`` offsets at a time);
- an offset delivered ``c`` times is delivered again only once a committed
  image records at least ``c`` for it.

A redelivery therefore waits for the next group commit (a few ms); in return
``delivery_count`` is never below the number of deliveries, and exceeds it by
at most one per broker crash.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from typing import Final

import attrs

from broky.subscriptions.ack_pass import SlotMaps, take_acked
from broky.subscriptions.acked_ranges import AckedRanges
from broky.subscriptions.pending_window import PendingWindow
from broky.subscriptions.timers import TimerQueue

#: Offsets leased ahead of the read position in each image: one commit per
#: this many new deliveries at most, and the most offsets whose count a crash
#: can raise without a delivery (they come back with count 2 instead of 1).
DEFAULT_LEASE: Final = 8192


@attrs.frozen(slots=True)
class SubscriptionImage:
    """The durable state of one (subscription, partition); see the module docstring."""

    cursor: int
    #: Sorted, disjoint, inclusive ranges above the cursor: a tuple of
    #: pairs, or their columns (``AckedRanges.columns``, what ``image``
    #: takes); equal either way.
    acked: Sequence[tuple[int, int]] = ()
    limit: int = 0
    counts: tuple[tuple[int, int], ...] = ()


@attrs.define(slots=True, eq=False)
class Pending:
    """A delivery of one offset, or of several handed out at once
    (``AckTracker.deliver_span``, consecutive offsets; ``deliver_group``,
    ascending ones: every offset maps to this one object, so a group costs
    one object and one timer, not one per message): who holds it, which
    delivery, until when, and ``live``, how many of its offsets are still
    pending with it (its timer is void at 0). Compared by identity:
    ``tracker.pending[offset] is span`` says the offset is still held under
    this delivery. The slot of an ordered type's offset is the dispatcher's
    to keep (a group may span slots)."""

    consumer: int
    count: int
    deadline: float
    live: int = 1
    #: A group's bounds ``[first, stop)`` (0, 0 for one offset).
    first: int = 0
    stop: int = 0


def backoff_delay(backoff: Sequence[float], count: int) -> float:
    """The delay before redelivering a message delivered ``count`` times
    (nack without delay, ack timeout): the schedule's last entry repeats."""
    if not backoff or count < 1:
        return 0.0
    return backoff[min(count - 1, len(backoff) - 1)]


class AckTracker:
    """Per-offset state of one (subscription, partition); see the module docstring."""

    def __init__(
        self,
        image: SubscriptionImage,
        *,
        ack_timeout: float,
        backoff: Sequence[float] = (),
        lease: int = DEFAULT_LEASE,
        end_offset: int | None = None,
        ordered: bool = False,
    ) -> None:
        """``end_offset``: the log's end at restore; offsets at or above it
        cannot have been delivered, whatever the limit says. ``ordered``:
        an ordered dispatcher's tracker, whose ``pending`` is a window
        indexed by offset (``PendingWindow``: its acks are scattered
        offsets, each an index store there, a hash pop in a dict)."""
        self.ack_timeout = ack_timeout
        self.backoff = tuple(backoff)
        self.lease = lease
        self.acked = AckedRanges(image.cursor, image.acked)
        #: Next offset to read from the log. A restore rewinds it to the cursor:
        #: offsets that may have been delivered are read (and delivered) again.
        self.read_position = image.cursor
        #: Delivery counts of unacked offsets delivered (or taken as delivered)
        #: before, except those a group delivery holds (``deliver_group``):
        #: their count is their delivery's (1), so a fresh delivery and its
        #: ack cost no entry here. Delivered and unacked: in ``counts`` or
        #: in ``pending``; ``release`` writes the count of an offset it takes
        #: back from a group.
        self.counts: dict[int, int] = {}
        self.pending: MutableMapping[int, Pending] = PendingWindow(image.cursor) if ordered else {}
        #: Offsets released for redelivery and when they are due.
        self.due: dict[int, float] = {}
        #: Why an offset was last nacked or termed (travels to the dead-letter topic).
        self.errors: dict[int, str] = {}
        self._deadlines = TimerQueue()
        self._sequence = itertools.count()
        #: The delivery of each span timer still in ``_deadlines``, by sequence.
        self._spans: dict[int, Pending] = {}
        #: The counts an image must carry (see ``image``), kept incrementally.
        self._persist: dict[int, int] = {}
        stored = dict(image.counts)
        self.durable_counts: dict[int, int] = dict(stored)
        self.durable_limit = image.limit
        self.limit = image.limit
        restored_end = image.limit if end_offset is None else min(image.limit, end_offset)
        for offset in range(image.cursor, restored_end):
            if offset not in self.acked:
                count = stored.get(offset, 0) + 1
                self.counts[offset] = count
                self._persist[offset] = count
        self.dirty = bool(self._persist)

    # --- questions -----------------------------------------------------------

    @property
    def cursor(self) -> int:
        return self.acked.cursor

    def count(self, offset: int) -> int:
        """How many times ``offset`` was delivered (or is taken to have been)."""
        count = self.counts.get(offset)
        if count is not None:
            return count
        held = self.pending.get(offset)
        return 0 if held is None else held.count

    def may_deliver(self, offset: int) -> bool:
        """The crash gates of the module docstring."""
        if offset >= self.durable_limit:
            return False
        count = self.count(offset)
        return count == 0 or self.durable_counts.get(offset, 0) >= count

    def unacked_below(self, end: int) -> int:
        """Offsets in [cursor, end) not acked (the backlog up to ``end``)."""
        return max(0, end - self.cursor) - self.acked.count_below(end)

    # --- changes -----------------------------------------------------------------

    def want_lease(self) -> None:
        """Raise the limit when fewer than half a lease of new offsets remain."""
        if self.limit - self.read_position < self.lease // 2:
            self.limit = self.read_position + self.lease
            self.dirty = True

    def deliver(self, offset: int, consumer: int, now: float) -> Pending:
        """Hand ``offset`` to ``consumer``; the caller checked ``may_deliver``."""
        count = self.count(offset) + 1
        self.counts[offset] = count
        if count >= 2:
            self._persist[offset] = count
            self.dirty = True
        self.due.pop(offset, None)
        deadline = now + self.ack_timeout
        pending = Pending(consumer, count, deadline)
        self.pending[offset] = pending
        self._deadlines.push((deadline, offset, next(self._sequence), offset + 1))
        if offset >= self.read_position:
            self.read_position = offset + 1
        return pending

    def deliver_span(self, first: int, stop: int, consumer: int, now: float) -> Pending:
        """Hand the never-delivered offsets ``[first, stop)`` to ``consumer``
        as one delivery (count 1); the caller checked that none was
        delivered, acked or is due, and that ``stop <= durable_limit``."""
        return self.deliver_group(range(first, stop), consumer, now)

    def deliver_group(self, offsets: Sequence[int], consumer: int, now: float) -> Pending:
        """Hand never-delivered ``offsets`` (ascending, not necessarily
        consecutive: an ordered dispatcher's messages of one consumer in one
        feed) to ``consumer`` as one delivery (count 1, one timer),
        under the same conditions as ``deliver_span``. Its ``[first, stop)``
        bounds the offsets; which of them it holds is ``pending``'s say
        (``pending[offset] is`` it), so the expiry scan checks each one.
        The offsets get no ``counts`` entry (see ``counts``)."""
        span = self.open_group(consumer, now)
        pending = self.pending
        if isinstance(pending, PendingWindow):
            pending.put_all(offsets, span)
        else:
            pending.update(dict.fromkeys(offsets, span))
        self.close_group(span, offsets[0], offsets[-1] + 1, len(offsets))
        return span

    def open_group(self, consumer: int, now: float) -> Pending:
        """``deliver_group`` in steps, for a caller that enters each offset
        in ``pending`` itself as it decides on it (the compiled fresh feed,
        ``broky.subscriptions._feed.feed_fresh``: no list and no second
        dict of the offsets): the delivery, empty until ``close_group``,
        which must follow before anything else reads the tracker."""
        return Pending(consumer, 1, now + self.ack_timeout, 0)

    def close_group(self, span: Pending, first: int, stop: int, live: int) -> None:
        """The ``live`` offsets of ``open_group``'s ``span``, within
        ``[first, stop)``, are in ``pending``: its bounds and its timer."""
        span.first, span.stop, span.live = first, stop, live
        sequence = next(self._sequence)
        if stop != first + 1:  # one offset's timer finds it in ``pending``
            self._spans[sequence] = span
        self._deadlines.push((span.deadline, first, sequence, stop))
        self.read_position = max(self.read_position, stop)

    def skip_read(self, offset: int) -> None:
        """The read position passes ``offset`` without a delivery (acked, or
        parked by the dispatcher for later)."""
        if offset >= self.read_position:
            self.read_position = offset + 1

    def ack_unread(self, offset: int) -> None:
        """``offset``, just read, is acked without a delivery (the
        subscription does not take its key): the cursor may move over it."""
        self.skip_read(offset)
        if self.acked.add(offset):
            self.dirty = True
            self.catch_up_read_position()

    def ack_delivered(
        self, offsets: Iterable[int], slots: SlotMaps | None = None
    ) -> tuple[list[int], dict[Pending, int], list[int]]:
        """Mark acked every offset of ``offsets`` that was delivered and is
        not acked yet (the others are skipped: an ack of a message never
        delivered acks nothing). Returns the offsets whose pending delivery
        ended, how many of them each delivery held (its ``live`` is
        lowered by as many), and the acked offsets that were waiting for a
        redelivery (``due``, not pending).

        Two passes over the offsets, each at C speed when compiled
        (``ack_pass``): one takes them out of the counts and pending
        deliveries, one merges them into the acked ranges (a key-shared
        consumer's acks are scattered offsets: one splice per settle, not
        one per offset). ``slots``: an ordered dispatcher's slot maps, the
        slot of each ended offset freed in the first pass (``take_acked``)."""
        done, ended, lost, waiting = take_acked(self.counts, self.pending, self.due, offsets, slots)
        if not done:
            return ended, lost, waiting
        self.dirty = True
        for held, count in lost.items():
            held.live -= count
        self.acked.add_sorted(done)
        self.catch_up_read_position()
        for side in (self.due, self.errors, self._persist):
            if side:
                for offset in done:
                    side.pop(offset, None)
        return ended, lost, waiting

    def ack_spans(self, offsets: range) -> tuple[list[tuple[Pending, int]], int]:
        """Ack ``offsets`` (step 1) from its start, a span delivery
        (``deliver_span``) at a time, while each of its offsets here is
        still pending with that delivery (so none is acked, due or counted
        twice). Returns each delivery touched with how many of its offsets
        ended, and the offset where this stopped: the caller acks the rest
        one by one. A consumer settles what it was dealt as ranges (cut
        where its client's settle batch filled), so this is most acks of a
        shared subscription: per span piece a check and a delete at C
        speed per offset, one acked range, no list entry per offset (a
        group's offsets have no ``counts`` entry)."""
        ended: list[tuple[Pending, int]] = []
        pending = self.pending
        position, stop = offsets.start, offsets.stop
        while position < stop:
            held = pending.get(position)
            if held is None or not held.first <= position < held.stop:
                break
            piece = range(position, min(stop, held.stop))
            size = len(piece)
            if size > held.live:
                break
            # Then every offset is held (live): a group with gaps has fewer
            # live offsets than its bounds hold, and stopped above.
            whole = size == held.stop - held.first
            # ``pending.get``: an offset of the piece taken back (a term or
            # nack of one offset of the span) is missing, not an error.
            if not whole and size > 1 and list(map(pending.get, piece)).count(held) != size:
                break
            deque(map(pending.__delitem__, piece), 0)
            held.live -= size
            self.acked.add_range(position, piece.stop - 1)
            if self.errors:
                for offset in piece:
                    self.errors.pop(offset, None)
            ended.append((held, size))
            position = piece.stop
        if ended:
            self.dirty = True
            self.catch_up_read_position()
        return ended, position

    def catch_up_read_position(self) -> None:
        """Everything below the cursor is acked: a read must not start
        there. The cursor can pass the read position when offsets acked
        before a restart (ranges of the image) or restored as delivered
        (``counts``, acked before they were read again) close the gap below
        an unread offset; a read from the old position would deliver acked
        offsets again (a fresh read checks nothing per offset)."""
        self.read_position = max(self.read_position, self.acked.cursor)

    def release(self, offset: int, due: float, error: str = "") -> Pending | None:
        """Take ``offset`` back from its consumer, due again at ``due``."""
        pending = self.pending.pop(offset, None)
        if pending is None:
            return None
        pending.live -= 1
        self.counts[offset] = pending.count
        self.due[offset] = due
        if error:
            self.errors[offset] = error
        self._persist[offset] = pending.count
        self.dirty = True
        return pending

    def park(self, offset: int, due: float) -> None:
        """An offset that is neither pending nor acked waits until ``due``."""
        self.due[offset] = due

    def extend(self, offset: int, consumer: int, now: float) -> bool:
        """``in_progress``: push the deadline of the consumer's delivery (an
        offset of a span gets a delivery of its own: the rest keep theirs)."""
        pending = self.pending.get(offset)
        if pending is None or pending.consumer != consumer:
            return False
        if pending.live > 1:
            pending.live -= 1
            pending = Pending(consumer, pending.count, 0.0)
            self.pending[offset] = pending
        pending.deadline = now + self.ack_timeout
        timer = (pending.deadline, offset, next(self._sequence), offset + 1)
        self._deadlines.push(timer)
        return True

    def expired(self, now: float) -> Iterator[tuple[int, Pending]]:
        """Pending deliveries whose deadline passed, by offset in deadline
        order (still pending: the caller releases them). A void timer (its
        delivery ended or was extended) is dropped unlooked-at."""
        deadlines = self._deadlines
        pending = self.pending
        while (front := deadlines.peek()) is not None and front[0] <= now:
            deadline, first, sequence, stop = deadlines.pop()
            held = self._delivery(first, sequence, stop)
            self._spans.pop(sequence, None)
            if held is not None and held.deadline == deadline:
                yield from ((o, held) for o in range(first, stop) if pending.get(o) is held)

    def next_deadline(self) -> float | None:
        deadlines, pending = self._deadlines, self.pending
        while (front := deadlines.peek()) is not None:
            deadline, first, sequence, stop = front
            if stop == first + 1:
                # ``_delivery`` inlined for one offset: every acked
                # key-shared message's timer is dropped here.
                held = pending.get(first)
                if held is not None and held.deadline == deadline:
                    return deadline
                deadlines.pop()
                continue
            held = self._delivery(first, sequence, stop)
            if held is not None and held.deadline == deadline:
                return deadline
            deadlines.pop()
            self._spans.pop(sequence, None)
        return None

    def _delivery(self, first: int, sequence: int, stop: int) -> Pending | None:
        """The live delivery a timer is for (None: the timer is void)."""
        if stop == first + 1:
            return self.pending.get(first)
        span = self._spans.get(sequence)
        return span if span is not None and span.live else None

    # --- durability -----------------------------------------------------------------

    def image(self) -> SubscriptionImage:
        """The state to commit now; pass it to ``committed`` once it is durable."""
        self.want_lease()
        self.dirty = False
        return SubscriptionImage(
            self.acked.cursor,
            self.acked.columns(),
            self.limit,
            tuple(sorted(self._persist.items())),
        )

    def committed(self, image: SubscriptionImage) -> None:
        """``image`` is durable: open the gates it covers."""
        self.durable_limit = max(self.durable_limit, image.limit)
        self.durable_counts = dict(image.counts)
