"""Backpressure from subscribers that drain to the readers that feed them.

Why: when the broker itself is the bottleneck, its readers (one per
publishing connection) can bring in bytes faster than the writers of the
subscribers get scheduled to send them, and the outboxes overflow although
every subscriber reads as fast as its socket delivers. The subscriber would
pay for the broker's saturation. Instead, as nats-server stalls a producer
whose consumer is behind, a reader pauses while some outbox above its
high-water mark belongs to a subscriber that *drains*: TCP then slows the
publishers, and nothing is lost.

A subscriber that does not drain never pauses anyone for long: one whose
socket write has been blocked for ``WRITE_STALL_SECONDS`` while its socket
has no room (the kernel's send buffer is full: the peer does not read), or
for ``MAX_WRITE_STALL_SECONDS`` in any case, is marked slow and
ignored until a write of its completes in half that time again (its socket
drains again: it was starved of CPU for a moment, not slow) or it leaves the
pressure; one without flow-control credit has nothing deliverable, so it is
ignored at once. Its own slow-consumer policy (drop or disconnect) applies to
it alone.

Sans-IO: outlets report their state here; the connection layer does the
waiting (``ServerConnection._yield_to_subscribers``) and gets a callback
when pressure is relieved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

#: A subscriber whose socket write has been blocked this long is slow, not
#: merely busy: 512 KiB (one write batch) in 100 ms is 5 MB/s, far below
#: any healthy reader on a LAN, and long enough for a busy client process
#: to get its share of a CPU back.
WRITE_STALL_SECONDS: Final = 0.1
#: Longest a paused reader sleeps before it looks again: credit running out
#: changes what is deliverable without an event of its own.
RECHECK_SECONDS: Final = 0.01
#: A write blocked past WRITE_STALL_SECONDS whose socket still has room is
#: waiting for the event loop, not for the subscriber (readers were busy
#: with big batches): it gets this long before it counts as slow anyway.
MAX_WRITE_STALL_SECONDS: Final = 1.0
#: A link to another worker of this node is part of the broker, not a
#: subscriber: when it falls behind, the broker is the bottleneck and its
#: publishers must slow down (TCP), not lose messages. Its blocked write
#: counts as slow only after this long (a worker stopped or wedged; the
#: supervisor restarts a dead one), so other clients are still isolated
#: from a worker that stopped for good.
LOCAL_LINK_STALL_SECONDS: Final = 5.0


class Pressing(Protocol):
    """What the pressure needs to know of an outlet (broky.router.outbox.Outlet)."""

    #: Marked once its write stayed blocked for WRITE_STALL_SECONDS; cleared
    #: by a quick write (Outlet.wrote) or when the outlet leaves the pressure.
    slow: bool
    #: When its writer's current socket write began (-1: not writing).
    write_started: float
    #: How long a blocked write may last before the outlet counts as slow:
    #: with its socket full, and in any case (WRITE_STALL_SECONDS and
    #: MAX_WRITE_STALL_SECONDS for clients, LOCAL_LINK_STALL_SECONDS for a
    #: link to another worker).
    write_stall_seconds: float
    max_write_stall_seconds: float
    #: A link to another worker of this node (not waited for by link readers).
    local_link: bool

    @property
    def deliverable(self) -> bool:
        """Whether it has runs its writer may send now (within credit)."""
        ...

    def socket_has_room(self) -> bool:
        """Whether its socket would take more bytes now (False if unknown)."""
        ...


class Pressure:
    """The outlets of one router above their high-water mark."""

    def __init__(self) -> None:
        self.outlets: set[Pressing] = set()
        #: Callbacks of paused readers, called (and forgotten) on relief.
        self._waiters: list[Callable[[], None]] = []
        #: Times a reader paused because of the pressure (a statistic).
        self.pauses = 0

    def add(self, outlet: Pressing) -> None:
        """``outlet`` passed its high-water mark."""
        self.outlets.add(outlet)

    def remove(self, outlet: Pressing) -> None:
        """``outlet`` is back under its low-water mark, or closed: wake the
        paused readers so they look again."""
        self.outlets.discard(outlet)
        outlet.slow = False
        waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()

    def wait_seconds(self, now: float, local_links: bool = True) -> float | None:
        """How long a reader should pause before looking again, or None if
        no outlet under pressure is draining (read on).

        Marks outlets whose write has been blocked for WRITE_STALL_SECONDS
        as slow (they are ignored from then on). A reader of a link from
        another worker passes ``local_links=False``: it waits for its own
        node's subscribers only, never for a link back to a worker, which
        could be waiting for it in turn.
        """
        wait: float | None = None
        for outlet in self.outlets:
            if outlet.slow or (outlet.local_link and not local_links):
                continue
            started = outlet.write_started
            blocked = now - started if started >= 0 else 0.0
            stall, max_stall = outlet.write_stall_seconds, outlet.max_write_stall_seconds
            if blocked >= stall and (blocked >= max_stall or not outlet.socket_has_room()):
                outlet.slow = True
                continue
            if started < 0 and not outlet.deliverable:
                continue  # waiting for credit: its application is the slow part
            # Look again when this write would count as slow, or sooner.
            threshold = stall if blocked < stall else max_stall
            left = threshold - blocked if started >= 0 else RECHECK_SECONDS
            wait = left if wait is None else min(wait, left)
        if wait is None:
            return None
        return max(min(wait, RECHECK_SECONDS), 0.001)

    def on_relief(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` once, at the next relief (a paused reader's event)."""
        self._waiters.append(wake)
        self.pauses += 1
