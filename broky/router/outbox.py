"""Outboxes: where the router leaves runs for a connection's writer.

Ownership: the router is the only producer (``Subscription.push``), the
connection's writer task the only consumer (``Outlet.take``); both run on the
same trio thread and neither awaits inside these methods, so no lock exists.

Bounds: each subscription holds at most ``max_messages`` messages and
``max_bytes`` bytes of runs (run chunks: message bytes plus ~60 bytes of run
header). What the writer has taken is in flight, at most ``write_batch_bytes``
plus one run per connection. A full outbox never makes the router wait: the
subscription's policy drops the run (counted, announced later by a Notice) or
marks the whole connection for a slow-consumer disconnect.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

import attrs

from broky.protocol.codec import (
    RUN_CHUNK_OVERHEAD,
    encode_frame,
    run_chunk_message_sizes,
    runs_frame_parts,
    split_run_chunk,
)
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    BodyType,
    ErrorCode,
    LinkKind,
    NoticeKind,
    SlowConsumerPolicy,
)
from broky.protocol.frames import EncodedRun, Notice
from broky.router.durable_runs import DurableEncodedRun
from broky.router.pressure import MAX_WRITE_STALL_SECONDS, WRITE_STALL_SECONDS, Pressure
from broky.router.statistics import RouterCounters
from broky.router.sweep import sweep

#: Bytes a Deliver frame adds besides 4 per run: size prefix, root, the
#: Frame and Deliver tables and vtables, the runs vector's length, padding.
DELIVER_HEADER_BYTES: Final = 68
#: Default per-subscription outbox bound in bytes: 4 MiB is ~25k messages of
#: 100 bytes, a quarter of a second of a fast stream. Worst-case memory is
#: this times the number of stalled subscriptions.
DEFAULT_OUTBOX_BYTES: Final = 4 * 1024 * 1024
#: Default per-subscription outbox bound in messages.
DEFAULT_OUTBOX_MESSAGES: Final = 100_000
#: Most bytes a writer takes for one socket write. Large enough that a
#: write's fixed cost (~12 us) is negligible per message, small enough that
#: one connection's write does not hog the loop (~0.1 ms of memcpy).
DEFAULT_WRITE_BATCH_BYTES: Final = 512 * 1024


@attrs.define(slots=True, eq=False)
class Subscription:
    """One subscribe stream of one connection, with its bounded outbox."""

    stream: int
    pattern: bytes
    policy: SlowConsumerPolicy
    outlet: Outlet
    max_messages: int
    max_bytes: int
    credit: int | None = None  # None: no flow control
    #: The queue group joined (b"": none; see broky.router.queues).
    queue: bytes = b""
    runs: deque[EncodedRun] = attrs.field(factory=deque)
    pending_messages: int = 0
    pending_bytes: int = 0
    unreported_drops: int = 0
    delivered_messages: int = 0
    dropped_messages: int = 0
    scheduled: bool = False
    closed: bool = False
    #: While a durable replay runs, live runs wait here (None: live). See
    #: broky.durable.replay: the replay dedupes them by offset at the seam.
    holding: list[EncodedRun] | None = None
    holding_bytes: int = 0
    #: Bumped whenever held durable runs had to be discarded (over the
    #: outbox bound): the replay then reads them from the log instead.
    holding_discards: int = 0
    #: Called after each ``take`` (a replay waiting for room sets it).
    drained: Callable[[], None] | None = None
    #: Confirmations still due from the other workers that own partitions
    #: this subscription reads (broky.durable.forwarding): ``Subscribed``
    #: waits for them, as it waits for the links' (Router.confirm).
    awaiting_owners: int = 0
    #: The links confirmed while owners were still due.
    links_confirmed: bool = False
    #: Past this many queued bytes the outlet is under pressure (half the
    #: bound: room for the readers to stop before anything overflows).
    high_water_bytes: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.high_water_bytes = self.max_bytes // 2

    def close(self) -> None:
        """Free the queued runs (its connection's share of ``pending_bytes``
        with them); the subscription takes nothing more."""
        self.closed = True
        self.outlet.pending_bytes -= self.pending_bytes
        self.runs.clear()
        self.pending_messages = self.pending_bytes = 0
        self.holding = None
        self.holding_bytes = 0
        self.drained = None

    def push(self, run: EncodedRun) -> None:
        """Queue a run without waiting; apply the slow-consumer policy if full."""
        if self.holding is not None:
            self._hold(run)
            return
        size = len(run.chunk)
        outlet = self.outlet
        if (
            self.pending_messages + run.count > self.max_messages
            or self.pending_bytes + size > self.max_bytes
        ):
            self._overflow(run)
            return
        if (
            outlet.max_pending_bytes
            and outlet.pending_bytes  # an idle connection takes any one run
            and outlet.pending_bytes + size > outlet.max_pending_bytes
        ):
            self._overflow(run, connection_full=True)
            return
        self.runs.append(run)
        self.pending_messages += run.count
        self.pending_bytes += size
        outlet.pending_bytes += size
        if self.pending_bytes > self.high_water_bytes and not outlet.pressed:
            outlet.press()
        if not self.scheduled and (self.credit is None or self.credit > 0):
            self.scheduled = True
            self.outlet.schedule(self)

    def push_many(self, runs: list[EncodedRun], messages: int, size: int) -> None:
        """``push`` each of ``runs`` (holding ``messages`` messages and
        ``size`` chunk bytes in all): at once when they all fit, which is
        the common case, else one by one so that the bounds apply per run."""
        outlet = self.outlet
        if (
            self.holding is not None
            or self.pending_messages + messages > self.max_messages
            or self.pending_bytes + size > self.max_bytes
            or (
                outlet.max_pending_bytes
                and outlet.pending_bytes
                and outlet.pending_bytes + size > outlet.max_pending_bytes
            )
        ):
            for run in runs:
                self.push(run)
            return
        self.runs.extend(runs)
        self.pending_messages += messages
        self.pending_bytes += size
        outlet.pending_bytes += size
        if self.pending_bytes > self.high_water_bytes and not outlet.pressed:
            outlet.press()
        if not self.scheduled and (self.credit is None or self.credit > 0):
            self.scheduled = True
            outlet.schedule(self)

    def _hold(self, run: EncodedRun) -> None:
        holding = self.holding
        assert holding is not None
        if self.holding_bytes + len(run.chunk) > self.max_bytes:
            # Durable runs are in the log: drop them here and let the replay
            # read them again; ephemeral ones are lost like any overflow.
            kept = [held for held in holding if not isinstance(held, DurableEncodedRun)]
            if len(kept) != len(holding):
                self.holding_discards += 1
                holding[:] = kept
                self.holding_bytes = sum(len(held.chunk) for held in kept)
            if isinstance(run, DurableEncodedRun):
                self.holding_discards += 1
                return
            if self.holding_bytes + len(run.chunk) > self.max_bytes:
                self._overflow(run)
                return
        holding.append(run)
        self.holding_bytes += len(run.chunk)

    def _overflow(self, run: EncodedRun, *, connection_full: bool = False) -> None:
        counters = self.outlet.counters
        if self.policy is SlowConsumerPolicy.DISCONNECT:
            if self.outlet.failure is None:  # one disconnect, however many runs overflow
                counters.slow_consumer_disconnects += 1
            pattern = self.pattern.decode(errors="replace")
            self.outlet.fail(
                ErrorCode.SLOW_CONSUMER,
                f"the connection fell behind by more than {self.outlet.max_pending_bytes} "
                f"bytes (max_pending_bytes) while delivering subscription {self.stream} "
                f"({pattern})"
                if connection_full
                else f"subscription {self.stream} ({pattern}) fell behind by more than "
                f"{self.max_messages} messages or {self.max_bytes} bytes",
            )
            return
        self.unreported_drops += run.count
        self.dropped_messages += run.count
        counters.dropped_slow_consumer += run.count
        self.outlet.dropped_messages += run.count
        if not self.scheduled and not self.runs:
            # Nothing queued: schedule anyway so the Notice goes out promptly.
            self.scheduled = True
            self.outlet.schedule(self)

    def grant(self, credit: int) -> None:
        """Add flow-control credit (ignored for subscriptions without flow control)."""
        if self.credit is None:
            return
        self.credit += credit
        if not self.scheduled and self.runs:
            self.scheduled = True
            self.outlet.schedule(self)

    def take(self, budget: int, parts: list[bytes]) -> int:
        """Move runs (within credit and ``budget`` bytes) into Deliver frames.

        Each frame fits the client's ``Outlet.max_frame_bytes``; a run too
        big for one frame is split between messages, and a single message
        that fits no frame is dropped (counted and announced like any drop).
        Appends the frames' parts (and a drop Notice once the outbox is
        empty) to ``parts``; returns the bytes taken. Leaves the subscription
        scheduled only if it still has deliverable runs.
        """
        chunks: list[bytes] = []
        frame_bytes = 0
        frame_room = self.outlet.max_frame_bytes - DELIVER_HEADER_BYTES
        taken_bytes = 0
        taken_messages = 0
        runs = self.runs
        credit = self.credit
        if credit is None:
            # The common case, without credit: the runs that fit the budget,
            # if they fit one frame too, in one sweep (broky.router.sweep).
            swept = sweep(runs, budget, frame_room)
            if swept is not None:
                chunks, taken_bytes, taken_messages = swept
                frame_bytes = taken_bytes
        while runs and taken_bytes < budget:
            if credit is not None and credit <= 0:
                break
            run = runs[0]
            room = frame_room - frame_bytes - 4 * len(chunks)
            over_credit = credit is not None and run.count > credit
            if len(run.chunk) + 4 > room or over_credit:
                if chunks and len(run.chunk) + 4 > room:
                    parts.extend(runs_frame_parts(BodyType.DELIVER, self.stream, chunks))
                    chunks, frame_bytes = [], 0
                    continue
                head = self._split_front(run, room - 4, credit)
                if head is None:
                    continue
                run = head
            else:
                runs.popleft()
            if credit is not None:
                credit -= run.count
            chunks.append(run.chunk)
            frame_bytes += len(run.chunk)
            taken_bytes += len(run.chunk)
            taken_messages += run.count
        self.credit = credit
        self.pending_messages -= taken_messages
        self.pending_bytes -= taken_bytes
        self.outlet.pending_bytes -= taken_bytes
        self.delivered_messages += taken_messages
        self.outlet.counters.delivered_messages += taken_messages
        self.outlet.delivered_messages += taken_messages
        if chunks:
            parts.extend(runs_frame_parts(BodyType.DELIVER, self.stream, chunks))
        if not runs and self.unreported_drops:
            parts.append(
                encode_frame(Notice(self.stream, NoticeKind.DROPPED, self.unreported_drops))
            )
            self.unreported_drops = 0
        self.scheduled = bool(runs) and (credit is None or credit > 0)
        if self.drained is not None:
            self.drained()
        return taken_bytes

    def _split_front(self, run: EncodedRun, room: int, credit: int | None) -> EncodedRun | None:
        """Split off the longest front of ``runs[0]`` that fits ``room`` bytes
        and ``credit`` messages, leaving the rest queued; the pending counters
        count the head until ``take`` takes it. Returns None after dropping a
        first message that fits no frame at all."""
        sizes = run_chunk_message_sizes(run.chunk)
        budget = room - RUN_CHUNK_OVERHEAD - len(run.key)
        limit = run.count if credit is None else min(credit, run.count)
        count = used = 0
        while count < limit and used + sizes[count] + 4 <= budget:
            used += sizes[count] + 4
            count += 1
        if count == 0:
            # The first message alone fits no frame the client accepts.
            count, dropped = 1, True
        else:
            dropped = False
        if count == run.count:
            self.runs.popleft()
            head_chunk = run.chunk
        else:
            head_chunk, tail = split_run_chunk(run.chunk, count)
            self.runs[0] = EncodedRun(run.key, run.count - count, tail)
            grown = len(tail) + len(head_chunk) - len(run.chunk)
            self.pending_bytes += grown
            self.outlet.pending_bytes += grown
        if dropped:
            self.pending_messages -= 1
            self.pending_bytes -= len(head_chunk)
            self.outlet.pending_bytes -= len(head_chunk)
            self.unreported_drops += 1
            self.dropped_messages += 1
            self.outlet.counters.dropped_slow_consumer += 1
            self.outlet.dropped_messages += 1
            return None
        return EncodedRun(run.key, count, head_chunk)


def _closed() -> None:
    """The ``wake`` of a closed outlet: there is nobody left to wake."""


class Outlet:
    """The outgoing side of one connection, as the router sees it.

    The connection supplies ``wake``, called once each time the outlet goes
    from idle to having work; its writer task then calls ``take``.
    """

    def __init__(
        self,
        wake: Callable[[], None],
        counters: RouterCounters,
        write_batch_bytes: int = DEFAULT_WRITE_BATCH_BYTES,
        max_pending_bytes: int = 0,
        pressure: Pressure | None = None,
    ) -> None:
        self._wake = wake
        #: The router's readers pause while this outlet is pressed and drains
        #: (broky.router.pressure); None: nobody pauses for it.
        self._pressure = pressure
        #: Whether a subscription passed its high-water mark (and the outlet
        #: is in the pressure's set) since it was last under its low-water mark.
        self.pressed = False
        #: Set by the pressure: its write stayed blocked, it is a slow consumer.
        self.slow = False
        #: When the writer's current socket write began (-1: not writing);
        #: set by the connection's writer task.
        self.write_started = -1.0
        #: When a blocked write makes it slow (see broky.router.pressure);
        #: a link to another worker of this node gets longer.
        self.write_stall_seconds = WRITE_STALL_SECONDS
        self.max_write_stall_seconds = MAX_WRITE_STALL_SECONDS
        #: Whether this is a link to another worker of this node.
        self.local_link = False
        #: Asks the connection whether its socket has room for more bytes
        #: (None: it cannot tell, e.g. an in-process pipe).
        self.writable: Callable[[], bool] | None = None
        #: Bound of ``pending_bytes`` (0: none; links have only per-subscription bounds).
        self.max_pending_bytes = max_pending_bytes
        #: Bytes queued across this connection's subscriptions: the sum of
        #: theirs, kept by them as they change (the router drops a closed
        #: subscription's share).
        self.pending_bytes = 0
        #: Largest frame the client accepts (its Hello); Deliver frames fit it.
        self.max_frame_bytes = DEFAULT_MAX_FRAME_BYTES
        #: A client, or a peer router's link (from Hello.link; set before subscribing).
        self.kind = LinkKind.CLIENT
        #: Who is on the other end, for statistics and logs.
        self.peer = ""
        #: Messages handed to the writer / dropped for this connection, ever.
        self.delivered_messages = 0
        self.dropped_messages = 0
        self.counters = counters
        self.write_batch_bytes = write_batch_bytes
        self.subscriptions: dict[int, Subscription] = {}
        self._ready: deque[Subscription] = deque()
        self._control: list[bytes] = []
        self._woken = False
        #: Set when the connection must close: (code, message) for the Error frame.
        self.failure: tuple[ErrorCode, str] | None = None

    def _notify(self) -> None:
        if not self._woken:
            self._woken = True
            self._wake()

    def schedule(self, subscription: Subscription) -> None:
        """Called by a subscription that has something to deliver."""
        self._ready.append(subscription)
        self._notify()

    def send_control(self, frame_bytes: bytes) -> None:
        """Queue an encoded control frame (Subscribed, Pong, a stream Error)."""
        self._control.append(frame_bytes)
        self._notify()

    def fail(self, code: ErrorCode, message: str) -> None:
        """Mark the connection for closing; the writer sends the Error and stops.

        The first failure always calls ``wake``, even if the outlet is already
        awake: a writer blocked on a slow socket learns from it to give up.
        """
        if self.failure is None:
            self.failure = (code, message)
            self._woken = True
            self._wake()

    def close(self) -> None:
        """Free everything queued here and forget the connection's ``wake``.

        Called by ``Router.detach`` when the connection ends. Queued frames
        and runs (up to ``max_pending_bytes``) are released at once, and the
        reference cycle connection -> outlet -> wake -> connection is broken,
        so a closed connection's memory goes back by reference counting
        instead of waiting for the cycle collector, which runs by object
        counts and not bytes (megabytes per connection would pile up).
        """
        self._wake = _closed
        self._woken = True  # a closed outlet never wakes anyone again
        self._ready.clear()
        self._control.clear()
        self._release()

    def press(self) -> None:
        """A subscription passed its high-water mark: readers may pause."""
        if self._pressure is not None:
            self.pressed = True
            self._pressure.add(self)

    def _release(self) -> None:
        if self.pressed:
            self.pressed = False
            assert self._pressure is not None
            self._pressure.remove(self)

    def wrote(self, seconds: float) -> None:
        """The writer's socket write took ``seconds``: a quick one shows a
        subscriber marked slow drains again (see broky.router.pressure)."""
        self.write_started = -1.0
        if self.slow and seconds < WRITE_STALL_SECONDS / 2:
            self.slow = False

    def socket_has_room(self) -> bool:
        """Whether the connection's socket would take more bytes now."""
        return self.writable is not None and self.writable()

    @property
    def deliverable(self) -> bool:
        """Whether some subscription has runs the writer may send now."""
        return bool(self._ready)

    @property
    def pending_messages(self) -> int:
        """Messages queued for this connection across its subscriptions."""
        return sum(sub.pending_messages for sub in self.subscriptions.values())

    def take(self) -> list[bytes]:
        """Everything to write now, as frame parts to join: control frames
        first, then Deliver frames round-robin within the write budget."""
        self._woken = False
        parts = self._control
        self._control = []
        budget = self.write_batch_bytes
        ready = self._ready
        while ready and budget > 0:
            subscription = ready.popleft()
            if subscription.closed or not subscription.scheduled:
                continue
            budget -= subscription.take(budget, parts)
            if subscription.scheduled:
                ready.append(subscription)
        if ready:
            self._woken = True  # more to do: the writer comes straight back
        if self.pressed and all(
            sub.pending_bytes * 2 <= sub.high_water_bytes for sub in self.subscriptions.values()
        ):
            self._release()  # every outbox at most a quarter full: low water
        return parts

    @property
    def has_work(self) -> bool:
        """True when ``take`` would return something (or the outlet failed)."""
        return bool(self._ready or self._control or self.failure)
