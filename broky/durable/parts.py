"""A Publish frame's runs for one partition: what an owner queues, appends
and acknowledges as one.

Real traffic changes key almost every message, so a frame of a thousand
messages is a thousand one-message runs spread over the partitions. Queued
run by run, each cost its own ack slot, producer identity, dedup lookup and
ticket update on the owner's side. Gathered into one :class:`Part` per
(frame, partition) they cost that once per part: the owner appends a part's
runs with one ``list.extend``, a round checks an idempotent part against
the producer's window with one comparison when it is new (the usual case),
and the ack entries of all its runs are added to the frame's ticket at once.

A part holds runs of one producer (0: none) whose sequences increase
(``Part.accepts``), so "its first sequence is past what the partition
stored of that producer" says every run of it is new. A frame whose runs
break that (another producer, a sequence going back) is gathered into
several parts, in arrival order, and keeps its per-run verdicts. Sans-IO;
the store gathers parts on the trio thread and hands them to the owners.
"""

from __future__ import annotations

from itertools import accumulate, repeat

import attrs

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.producers import Identity
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Run


@attrs.define(slots=True, eq=False)
class Part:
    """Runs of one frame bound for one partition, in frame order.

    ``indexes`` holds each run's index in its frame (what its ack entry
    names), ``sequences`` each run's first sequence when ``producer`` is
    set (empty otherwise). ``messages`` and ``nbytes`` are the runs'
    message count and message bytes (what they add to the store's bounds).
    """

    stamp: int
    ticket: AckTicket | None
    acks: AckQueue | None
    producer: int = 0
    runs: list[Run] = attrs.field(factory=list)
    #: Each run's message count (kept beside ``runs``: a round and the acks read it).
    counts: list[int] = attrs.field(factory=list)
    indexes: list[int] = attrs.field(factory=list)
    sequences: list[int] = attrs.field(factory=list)
    messages: int = 0
    nbytes: int = 0
    #: The sequence after the last run's messages (0: none yet).
    next_sequence: int = 0

    def accepts(self, producer: int, sequence: int) -> bool:
        """Whether a run of ``producer`` starting at ``sequence`` may join
        (same producer, sequences still increasing)."""
        return producer == self.producer and (not producer or sequence >= self.next_sequence)

    def add(self, run: Run, index: int, sequence: int = 0) -> None:
        """Add the next run (``sequence``: its first, when the part has a producer)."""
        self.runs.append(run)
        self.indexes.append(index)
        count = run.count
        self.counts.append(count)
        if self.producer:
            self.sequences.append(sequence)
            self.next_sequence = sequence + count
        self.messages += count
        self.nbytes += len(run.messages)

    def identities(self) -> list[tuple[int, int]]:
        """Each run's ``(producer, first sequence)``, (0, 0) without a producer:
        the log's producer columns."""
        if not self.producer:
            return [(0, 0)] * len(self.runs)
        return list(zip(repeat(self.producer), self.sequences))

    def settle(self, partition: int, first_offset: int) -> AckQueue | None:
        """The part was stored from ``first_offset``: give every run its ack
        entry; the ack queue to release (None: nobody waits)."""
        ticket = self.ticket
        if ticket is None:
            return None
        if self.messages == len(self.counts):  # one message per run (a key per message)
            # One list for both columns: each offset is one int object, not two.
            offsets = list(range(first_offset, first_offset + self.messages))
            ticket.stored(self.indexes, partition, offsets, offsets)
            return self.acks
        ends = list(accumulate(self.counts, initial=first_offset))
        ticket.stored(self.indexes, partition, ends[:-1], map((-1).__add__, ends[1:]))
        return self.acks

    def fail(self, reason: str, code: ErrorCode) -> AckQueue | None:
        """The part was not stored: fail its frame (its runs, for a
        forwarded frame); the queue to release."""
        if self.ticket is None:
            return None
        self.ticket.failed(reason, code, self.indexes)
        return self.acks

    def split(self, keep: list[int]) -> Part:
        """A part of this one's runs at positions ``keep`` (same frame and stamp)."""
        part = Part(self.stamp, self.ticket, self.acks, self.producer)
        for position in keep:
            run = self.runs[position]
            part.runs.append(run)
            part.counts.append(run.count)
            part.indexes.append(self.indexes[position])
            if self.producer:
                part.sequences.append(self.sequences[position])
            part.messages += run.count
            part.nbytes += len(run.messages)
        part.next_sequence = self.next_sequence
        return part


def round_columns(
    parts: list[Part],
) -> tuple[list[Run], list[int], list[Identity] | None, int]:
    """The runs of a round's ``parts`` in order, each one's stamp, each
    one's producer identity (None when no part has a producer: a version 2
    batch) and their message count (broky.durable.owner)."""
    runs: list[Run] = []
    stamps: list[int] = []
    messages = 0
    for part in parts:
        runs.extend(part.runs)
        stamps.extend([part.stamp] * len(part.runs))
        messages += part.messages
    if not any(part.producer for part in parts):
        return runs, stamps, None, messages
    producers: list[Identity] = []
    for part in parts:
        producers.extend(part.identities())
    return runs, stamps, producers, messages
