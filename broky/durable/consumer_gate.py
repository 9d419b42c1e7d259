"""The credit of a consumer spread over several workers (sans-IO).

A client's ``Consume`` whose pattern reaches partitions of several workers
is served by *parts*, one per owner worker (broky.durable.consumer_relays).
Each part is a consumer of its owner's dispatchers with credit of its own;
the client granted one window. This gate keeps the client's window whole:

- **Window.** ``window`` is the client's credit not used yet (its grants
  minus the messages sent to it). Deliveries from the parts are sent on
  while the window lasts, split inside a run when it ends there; the rest
  waits here.
- **Shares.** A part's credit is topped up to an equal share of the window
  (``window // parts``, at least 1) whenever none of its messages waits
  here. Credit given to an owner cannot be taken back (the protocol has no
  revoke), so the parts may together hold more than the window is now;
  what they deliver beyond it waits here, in order, until the client grants
  again. The client never receives more than it granted, and what waits
  stays bounded: a part is topped up only with nothing of it waiting, so
  each part's credit plus its waiting messages is at most one share of the
  largest window the client ever had open, plus one.
- **Why every idle part gets its share.** A client grants in batches (the
  client library returns half its window at a time): while it still has
  credit outstanding it waits for messages, not for room. So whenever the
  window is open, every part must hold credit, whatever the others hold.
  An earlier rule kept the parts' credit plus the waiting messages within
  the window (plus one per part); an owner that came back after a restart
  then found its idle siblings holding the whole window, got no credit, and
  the consumer stalled with the client's credit outstanding and the
  owner's backlog unread.
- **Order.** Runs wait in arrival order, and a part's runs arrive in the
  order its owner sent them (each owner's order is kept).

So a client is never kept waiting while its window is open and some part
has messages, however it spaces its grants.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

import attrs

from broky.protocol.codec import encode_frame, runs_frame_parts, split_run_chunk
from broky.protocol.constants import BodyType
from broky.protocol.frames import Redelivered

#: One delivery count above 1: the message's topic, offset and count.
Count = tuple[str, int, int]


@attrs.define(slots=True, eq=False)
class Waiting:
    """A run received from a part, not yet sent to the client."""

    chunk: bytes
    count: int
    partition: int
    base_offset: int
    #: Delivery counts (> 1) of its messages, from the Redelivered before it.
    counts: list[Count] = attrs.field(factory=list)
    #: Its topic: the one the part's last ``Redelivered`` named.
    topic: str = ""
    #: The part that delivered it (set by ``CreditGate.arrive``).
    part: int = -1

    def split(self, first: int) -> Waiting:
        """Take the first ``first`` messages off as a run of their own."""
        head, tail = split_run_chunk(self.chunk, first)
        stop = self.base_offset + first
        taken = Waiting(
            head,
            first,
            self.partition,
            self.base_offset,
            [c for c in self.counts if c[1] < stop],
            self.topic,
            self.part,
        )
        self.chunk = tail
        self.count -= first
        self.base_offset = stop
        self.counts = [c for c in self.counts if c[1] >= stop]
        return taken


class CreditGate:
    """See the module docstring. ``stream`` is the client's consumer stream;
    ``frame_bytes`` bounds the run bytes of one Deliver frame to the client."""

    def __init__(self, stream: int, parts: Iterable[int], frame_bytes: int) -> None:
        self.stream = stream
        self.frame_bytes = frame_bytes
        #: The client's credit not used yet.
        self.window = 0
        #: Credit each part holds (messages it may still send).
        self.held: dict[int, int] = dict.fromkeys(parts, 0)
        self.waiting: deque[Waiting] = deque()
        self.waiting_messages = 0
        #: Messages of each part waiting here (a part is topped up only at 0).
        self.queued: dict[int, int] = {}
        #: Messages sent to the client and granted by it, in total.
        self.sent = 0
        self.granted = 0
        #: The topic the client's stream last heard named (``Redelivered``
        #: names the topic of every ``Deliver`` after it; None: none yet).
        self.named: str | None = None

    def grant(self, credit: int) -> None:
        """The client's ``Flow``."""
        self.window += credit
        self.granted += credit

    def arrive(self, part: int, runs: Sequence[Waiting]) -> None:
        """``runs`` delivered by ``part`` (each consumed a credit of it)."""
        count = 0
        for run in runs:
            run.part = part
            self.waiting.append(run)
            count += run.count
        self.waiting_messages += count
        self.queued[part] = self.queued.get(part, 0) + count
        self.held[part] = max(0, self.held[part] - count)

    def drop(self, part: int, owned: Callable[[Waiting], bool]) -> None:
        """``part`` is gone (its owner went down): forget its credit and the
        runs of it that wait here (``owned`` tells them; the owner
        redelivers them). ``held[part] = 0`` brings it back."""
        self.held.pop(part, None)
        kept = deque(run for run in self.waiting if not owned(run))
        self.waiting_messages = sum(run.count for run in kept)
        self.waiting = kept
        self.queued = {}
        for run in kept:
            self.queued[run.part] = self.queued.get(run.part, 0) + run.count

    def take(self) -> list[bytes]:
        """The frames to send the client now (its window allowing), in order:
        one topic per Deliver, preceded by a Redelivered naming it (with its
        messages' delivery counts above 1) when it has counts or another
        topic than the stream's last named one (docs/protocol.md)."""
        frames: list[bytes] = []
        chunks: list[bytes] = []
        counts: list[tuple[int, int, int]] = []
        topic = ""
        used = 0
        while self.waiting and self.window > 0:
            head = self.waiting[0]
            whole = head.count <= self.window
            run = self.waiting.popleft() if whole else head.split(self.window)
            self.window -= run.count
            self.waiting_messages -= run.count
            self.queued[run.part] -= run.count
            self.sent += run.count
            if chunks and (used + len(run.chunk) > self.frame_bytes or run.topic != topic):
                self._frame(frames, topic, chunks, counts)
                chunks, counts, used = [], [], 0
            topic = run.topic
            chunks.append(run.chunk)
            counts.extend((run.partition, offset, n) for _, offset, n in run.counts)
            used += len(run.chunk)
        if chunks:
            self._frame(frames, topic, chunks, counts)
        return frames

    def _frame(
        self,
        frames: list[bytes],
        topic: str,
        chunks: list[bytes],
        counts: list[tuple[int, int, int]],
    ) -> None:
        if counts or topic != self.named:
            frames.append(
                encode_frame(
                    Redelivered(
                        self.stream,
                        partitions=tuple(entry[0] for entry in counts),
                        offsets=tuple(entry[1] for entry in counts),
                        counts=tuple(entry[2] for entry in counts),
                        topic=topic,
                    )
                )
            )
            self.named = topic
        frames.append(b"".join(runs_frame_parts(BodyType.DELIVER, self.stream, chunks)))

    def shares(self) -> dict[int, int]:
        """Credit to give each part now (parts left out get none): each part
        none of whose messages waits here is topped up to its share."""
        held = self.held
        if not held:
            return {}
        share = max(1, self.window // len(held))
        queued = self.queued
        grants: dict[int, int] = {}
        for part, credit in held.items():
            if credit < share and not queued.get(part):
                held[part] = share
                grants[part] = share - credit
        return grants
