"""The credit of a consumer spread over several workers (sans-IO).

A client's ``Consume`` whose pattern reaches partitions of several workers
is served by *parts*, one per owner worker (broky.durable.consumer_relays).
Each part is a consumer of its owner's dispatchers with credit of its own;
the client granted one window. This gate keeps the client's window whole:

- **Window.** ``window`` is the client's credit not used yet (its grants
  minus the messages sent to it). Deliveries from the parts are sent on
  while the window lasts, split inside a run when it ends there; the rest
  waits here.
- **Shares.** A part's credit is topped up to its share of the window
  whenever none of its messages waits here: two windows split between the
  parts, at most one window each (``min(window, 2 * window // parts)``,
  at least 1). Why two windows and not one: parts deliver at uneven
  moments, and a part that runs out of credit leaves its owner's messages
  for this consumer parked (a key-shared owner then holds back the keys
  behind them and re-reads them from the log when credit comes), while the
  client still has room that another part's share covers; with one window
  split evenly a key-shared consumer over two workers parked often enough
  to cost ~8 % of its throughput (bench_consumers, four pairs). Credit
  given to an owner cannot be taken back (the protocol has no revoke), so
  the parts may together hold more than the window is now; what they
  deliver beyond it waits here, in order, until the client grants again.
  The client never receives more than it granted, and what waits stays
  bounded: a part is topped up only with nothing of it waiting, so each
  part's credit plus its waiting messages is at most one share of the
  largest window the client ever had open, plus one: all parts together
  at most two such windows plus one message per part.
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
- **Whole frames.** A part's Deliver usually arrives as a
  :class:`WaitingFrame`: its bytes with the client's stream already set and
  its messages counted, no run decoded. While it fits the open window (and
  the frame limit) it is sent on as it is, so relaying costs per frame, not
  per run: key-shared over many keys delivers one message per run, and
  decoding, gating and re-encoding each was most of a spread consumer's
  cost. One that does not fit is taken apart into its runs where it waits,
  and those go on as any run does (split where the window ends).

So a client is never kept waiting while its window is open and some part
has messages, however it spaces its grants.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Sequence

import attrs

from broky.protocol.chunk_reading import RUNS_FRAME_RUNS_AT, RUNS_FRAME_STREAM_AT, read_runs_frame
from broky.protocol.chunks import RUNS_VECTOR_AT, encode_chunk, runs_frame_parts
from broky.protocol.codec import (
    count_located,
    decode_frame,
    encode_frame,
    split_run_chunk,
)
from broky.protocol.constants import BodyType
from broky.protocol.frames import Buffer, Deliver, Redelivered, Run
from broky.protocol.located import count_located_pure

#: Messages of a Deliver's runs when all are located chunks, else -1.
located_messages = count_located or count_located_pure

#: One delivery count above 1: the message's topic, offset and count.
Count = tuple[str, int, int]
#: A Redelivered's entry: topic, partition, offset and delivery count.
PartCount = tuple[str, int, int, int]

_U32 = struct.Struct("<I")
#: Size of a frame's size prefix.
_PREFIX_BYTES = 4


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


def waiting_runs(runs: Sequence[Run], counts: Sequence[PartCount], topic: str) -> list[Waiting]:
    """``runs`` of a Deliver of ``topic`` (the one the part's stream last
    named) as gate entries, each with the delivery counts (from the
    Redelivered before it) of its messages."""
    found = []
    for run in runs:
        stop = run.base_offset + run.count
        mine = [
            (topic, offset, count)
            for topic, partition, offset, count in counts
            if partition == run.partition and run.base_offset <= offset < stop
        ]
        found.append(
            Waiting(encode_chunk(run), run.count, run.partition, run.base_offset, mine, topic)
        )
    return found


@attrs.define(slots=True, eq=False)
class WaitingFrame:
    """A part's whole Deliver, not yet sent to the client (module docstring)."""

    #: The frame, size prefix included, on the client's stream.
    data: bytes
    #: Its messages and runs.
    count: int
    runs: int
    #: Delivery counts (> 1) of its messages, from the Redelivered before it.
    counts: list[PartCount]
    #: Its topic: the one the part's last ``Redelivered`` named.
    topic: str
    part: int = -1

    @property
    def chunk_bytes(self) -> int:
        """The bytes of its runs (what ``CreditGate.frame_bytes`` bounds)."""
        vector_end = RUNS_VECTOR_AT + 4 + 4 * self.runs
        return len(self.data) - vector_end - ((-vector_end) & 7)

    def unpack(self) -> list[Waiting]:
        """Its runs, as entries of their own."""
        frame = decode_frame(memoryview(self.data)[_PREFIX_BYTES:])
        assert isinstance(frame, Deliver)  # made by ``waiting_frame`` from one
        runs = waiting_runs(frame.runs, self.counts, self.topic)
        for run in runs:
            run.part = self.part
        return runs


def waiting_frame(
    buf: Buffer, stream: int, counts: list[PartCount], topic: str
) -> WaitingFrame | None:
    """The Deliver frame ``buf`` (the bytes after its size prefix) as a
    gate entry on the client's ``stream``, if our encoder laid it out and all
    its runs are located chunks (counted without decoding them); else None
    (the caller decodes it and hands its runs over one by one)."""
    head = read_runs_frame(buf)
    if head is None or head[0] != BodyType.DELIVER:
        return None
    runs = head[4]
    messages = located_messages(buf, RUNS_FRAME_RUNS_AT, runs)
    if messages < 0:
        return None
    at = RUNS_FRAME_STREAM_AT
    data = b"".join((_U32.pack(len(buf)), buf[:at], _U32.pack(stream), buf[at + 4 :]))
    return WaitingFrame(data, messages, runs, counts, topic)


#: What waits in the gate: a run, or a part's Deliver kept whole.
Entry = Waiting | WaitingFrame


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
        self.waiting: deque[Entry] = deque()
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

    def arrive(self, part: int, runs: Sequence[Entry]) -> None:
        """``runs`` (runs or whole frames) delivered by ``part`` (each
        message consumed a credit of it)."""
        count = 0
        for run in runs:
            run.part = part
            self.waiting.append(run)
            count += run.count
        self.waiting_messages += count
        self.queued[part] = self.queued.get(part, 0) + count
        self.held[part] = max(0, self.held[part] - count)

    def drop(self, part: int) -> None:
        """``part`` is gone (its owner went down): forget its credit and the
        runs and frames of it that wait here (the owner redelivers them).
        ``held[part] = 0`` brings it back."""
        self.held.pop(part, None)
        kept = deque(run for run in self.waiting if run.part != part)
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
            if isinstance(head, WaitingFrame):
                self.waiting.popleft()
                if head.count > self.window or (
                    head.runs > 1 and head.chunk_bytes > self.frame_bytes
                ):
                    self.waiting.extendleft(reversed(head.unpack()))
                    continue
                self._taken(head)
                if chunks:
                    self._frame(frames, topic, chunks, counts)
                    chunks, counts, used = [], [], 0
                self._name(frames, head.topic, [(p, o, n) for _, p, o, n in head.counts])
                frames.append(head.data)
                continue
            whole = head.count <= self.window
            if whole:
                self.waiting.popleft()
            run = head if whole else head.split(self.window)
            self._taken(run)
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

    def _taken(self, entry: Entry) -> None:
        self.window -= entry.count
        self.waiting_messages -= entry.count
        self.queued[entry.part] -= entry.count
        self.sent += entry.count

    def _frame(
        self,
        frames: list[bytes],
        topic: str,
        chunks: list[bytes],
        counts: list[tuple[int, int, int]],
    ) -> None:
        self._name(frames, topic, counts)
        frames.append(b"".join(runs_frame_parts(BodyType.DELIVER, self.stream, chunks)))

    def _name(self, frames: list[bytes], topic: str, counts: list[tuple[int, int, int]]) -> None:
        """A Redelivered before a Deliver of ``topic`` whose messages have
        ``counts``, if it has counts or the stream last heard another topic."""
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

    def shares(self) -> dict[int, int]:
        """Credit to give each part now (parts left out get none): each part
        none of whose messages waits here is topped up to its share."""
        held = self.held
        if not held:
            return {}
        share = max(1, min(self.window, 2 * self.window // len(held)))
        queued = self.queued
        grants: dict[int, int] = {}
        for part, credit in held.items():
            if credit < share and not queued.get(part):
                held[part] = share
                grants[part] = share - credit
        return grants
