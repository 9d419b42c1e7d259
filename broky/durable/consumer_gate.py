"""The credit of a consumer spread over several workers (sans-IO).

A client's ``Consume`` whose pattern reaches partitions of several workers
is served by *parts*, one per owner worker (broky.durable.consumer_relays).
Each part is a consumer of its owner's dispatchers with credit of its own;
the client granted one window. This gate keeps the client's window whole:

- **Window.** ``window`` is the client's credit not used yet (its grants
  minus the messages sent to it). Deliveries from the parts are sent on
  while the window lasts, split inside a run when it ends there; the rest
  waits here, in arrival order (so each owner's order is kept).
- **Shares.** A part's credit is topped up to an equal share of the window
  (at least 1), lowest holders first, as long as the credit held by the
  parts plus the messages waiting here stay within ``window + parts``:
  at most one message per part beyond the client's window ever waits here
  (a part's last credit), and the client never receives more than it
  granted.
- **Why the one message of slack.** Credit given to an owner cannot be
  taken back (the protocol has no revoke). Were every share rounded down,
  a window smaller than the number of parts would leave some part with
  none while an idle part sat on the rest, for good. With a credit of at
  least one per part, a part that has messages always gets to send: once
  the client has returned what it received, the idle parts hold at most
  their shares and the room left is at least one message.

A client that grants as it consumes (``Flow`` after processing, the
protocol's recommended use) is never kept waiting while a part has
messages; one that waits for its whole window before granting again may
wait on credit an idle part holds, since each part has only its share.
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
            self.waiting.append(run)
            count += run.count
        self.waiting_messages += count
        self.held[part] = max(0, self.held[part] - count)

    def drop(self, part: int, owned: Callable[[Waiting], bool]) -> None:
        """``part`` is gone (its owner went down): forget its credit and the
        runs of it that wait here (``owned`` tells them; the owner
        redelivers them). ``held[part] = 0`` brings it back."""
        self.held.pop(part, None)
        kept = deque(run for run in self.waiting if not owned(run))
        self.waiting_messages = sum(run.count for run in kept)
        self.waiting = kept

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
        """Credit to give each part now (parts left out get none)."""
        held = self.held
        if not held:
            return {}
        share = max(1, self.window // len(held))
        room = self.window + len(held) - sum(held.values()) - self.waiting_messages
        grants: dict[int, int] = {}
        for part in sorted(held, key=held.__getitem__):
            if room <= 0:
                break
            give = min(share - held[part], room)
            if give > 0:
                held[part] += give
                room -= give
                grants[part] = give
        return grants
