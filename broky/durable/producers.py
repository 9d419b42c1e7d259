"""Idempotent producers: what a partition remembers to store a retry once.

Sans-IO bookkeeping owned by one partition's owner (broky.durable.store).
A producer numbers its messages from 1 over all its acked frames; a frame's
run parts reach a partition with the sequence of their first message
(``docs/protocol.md``). For each producer the window keeps the runs it
appended here, ``(first sequence, count, first offset)``, for the last
``WINDOW_SEQUENCES`` sequences of that producer. A run is then:

- **new** if its sequence is past the last one appended from its producer
  (or the producer is unknown here): append it. Sequences jump ahead at a
  partition, since the producer's other messages go to other partitions;
- a **duplicate** if a remembered run starts at that sequence with the same
  count: answer with the remembered offsets, append nothing;
- **out of order** otherwise: a retry older than the window, or a run sent
  again after later runs of its producer were stored (storing it would
  reorder the producer's messages). Refused with ``OutOfOrderSequence``;
- **held** if it is past a sequence of its producer this partition refused
  retriably (NotLeader, NotEnoughReplicas: ``refused``) and has not stored
  since. Refused with the retriable ``SequenceGap``. Sequences jump here, so
  the partition cannot see that a producer's earlier run is missing; without
  this a pipelined producer's later run, already in flight when the earlier
  one was refused, could be stored first (the ISR recovered, or this node
  was elected, in between), and the earlier one's retry would then be out
  of order. The client resends from the refused run (broky.client.cluster),
  and a stored run of the producer that reaches the refused sequence ends
  the hold (one that ends below it, an earlier run stored by another leader
  and replicated here, leaves the gap open).

The client keeps at most ``WINDOW_SEQUENCES`` sequences unacknowledged, so
every retry it makes falls inside the window. The window is rebuilt from the
log's producer columns when a partition is opened, so a retry after a
SIGKILL of the owner is recognised too, as long as its original is within
the log tail that is read (``RECOVERY_TAIL_BYTES``).

Like Kafka (KIP-98) the window is per producer and partition; unlike
Kafka's five batches it is counted in sequences, because one client frame
can hold hundreds of one-message runs per partition (a key per message).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from itertools import accumulate
from typing import Final

import attrs

#: An idempotent producer's run: ``(producer id, sequence of its first message)``.
Identity = tuple[int, int]
#: Sequences of each producer a partition remembers (and that a client may
#: keep unacknowledged): at 100-byte messages, 6.5 MB of publishes in flight,
#: several group commits. Memory: at most one entry (~100 bytes) per run
#: remembered, so at most ~6.5 MB per producer and partition when every run
#: is one message, usually far less.
WINDOW_SEQUENCES: Final = 65_536
#: Producers a partition remembers; past this the least recently seen one is
#: forgotten (its next run is taken as new). Bounds the window's memory.
MAX_PRODUCERS: Final = 4_096
#: Bytes at the end of a partition's log whose producer columns rebuild the
#: window on open (whole segments, from headers and run tables only).
RECOVERY_TAIL_BYTES: Final = 64 * 1024 * 1024


@attrs.frozen(slots=True)
class Duplicate:
    """A run already stored: the offset its first message got."""

    first_offset: int


@attrs.frozen(slots=True)
class OutOfOrder:
    """A run the partition cannot place; ``reason`` says why, for the client."""

    reason: str


@attrs.frozen(slots=True)
class Held:
    """A run past a sequence of its producer refused here retriably and not
    resent yet (module docstring); ``reason`` says which, for the client."""

    reason: str


#: The verdict on one run: None (new: append it), a Duplicate, an
#: OutOfOrder or a Held.
Verdict = Duplicate | OutOfOrder | Held | None


@attrs.define(slots=True)
class _Runs:
    """One producer's remembered runs at one partition, oldest first, as
    parallel lists (``start`` skips pruned entries until they are compacted)."""

    sequences: list[int] = attrs.field(factory=list)
    counts: list[int] = attrs.field(factory=list)
    offsets: list[int] = attrs.field(factory=list)
    start: int = 0
    #: The sequence after the last one appended.
    next_sequence: int = 0


class ProducerWindow:
    """The idempotent producers of one partition (module docstring)."""

    def __init__(self, window: int = WINDOW_SEQUENCES, max_producers: int = MAX_PRODUCERS) -> None:
        self.window = window
        self.max_producers = max_producers
        self._producers: OrderedDict[int, _Runs] = OrderedDict()
        #: The producer recorded last (already the most recently used).
        self._last = 0
        #: Per producer, the first sequence refused retriably and not stored
        #: since (``refused``); at most ``max_producers``, oldest dropped.
        self._refused: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, producer: int, sequence: int, count: int) -> Verdict:
        """What to do with a run of ``count`` messages from ``producer``
        whose first message has ``sequence``."""
        runs = self._producers.get(producer)
        if runs is None or sequence >= runs.next_sequence:
            return self._held(producer, sequence)
        index = bisect_left(runs.sequences, sequence, runs.start)
        if index < len(runs.sequences) and runs.sequences[index] == sequence:
            if runs.counts[index] == count:
                return Duplicate(runs.offsets[index])
            return OutOfOrder(
                f"producer {producer:#x} sent sequence {sequence} again with "
                f"{count} messages instead of {runs.counts[index]}"
            )
        oldest = runs.sequences[runs.start] if runs.start < len(runs.sequences) else sequence
        if sequence < oldest:
            return OutOfOrder(
                f"producer {producer:#x}: sequence {sequence} is older than the "
                f"{self.window} sequences this partition remembers"
            )
        return OutOfOrder(
            f"producer {producer:#x}: sequence {sequence} was not stored but later ones "
            f"(up to {runs.next_sequence - 1}) were; storing it now would reorder them"
        )

    def admit(self, producer: int, sequence: int, count: int, first_offset: int) -> Verdict:
        """``check``, and ``record`` the run at ``first_offset`` when it is
        new: the owner's per-run call, one lookup in the common case."""
        runs = self._producers.get(producer)
        if (runs is not None and sequence < runs.next_sequence) or self._refused:
            verdict = self.check(producer, sequence, count)
            if verdict is not None:
                return verdict
        self.record(producer, sequence, count, first_offset)
        return None

    def admit_all(
        self, producer: int, sequences: list[int], counts: list[int], first_offset: int
    ) -> bool:
        """Record runs of ``producer`` (increasing ``sequences``, stored one
        after the other from ``first_offset``) if they are all new, i.e. the
        first is past every sequence stored of the producer: one lookup for
        the whole group (broky.durable.parts). False, recording nothing, if
        not: the caller then ``admit``s them one by one."""
        runs = self._producers.get(producer)
        if runs is not None and sequences[0] < runs.next_sequence:
            return False
        if self._refused and sequences[0] > self._refused.get(producer, sequences[0]):
            return False
        offsets = list(accumulate(counts, initial=first_offset))
        offsets.pop()
        self._record(producer, sequences, counts, offsets)
        return True

    def record(self, producer: int, sequence: int, count: int, first_offset: int) -> None:
        """Remember an appended run (a new one: past every remembered sequence)."""
        self._record(producer, [sequence], [count], [first_offset])

    def _record(
        self, producer: int, sequences: list[int], counts: list[int], offsets: list[int]
    ) -> None:
        """Remember appended runs, new ones in increasing order, and forget
        what falls out of the window."""
        producers = self._producers
        runs = producers.get(producer)
        if runs is None:
            runs = producers[producer] = _Runs()
            if len(producers) > self.max_producers:
                producers.popitem(last=False)
        elif producer != self._last:
            producers.move_to_end(producer)
        self._last = producer
        runs.sequences.extend(sequences)
        runs.counts.extend(counts)
        runs.offsets.extend(offsets)
        runs.next_sequence = sequences[-1] + counts[-1]
        if self._refused and runs.next_sequence > self._refused.get(producer, runs.next_sequence):
            # The refused sequence is stored now (resent here, or a leader's
            # run a follower replicates): the gap is closed. A run that ends
            # below it (an earlier batch stored elsewhere and replicated
            # here) leaves the gap open: the hold stays.
            del self._refused[producer]
        floor = runs.next_sequence - self.window
        stored = runs.sequences
        # Runs never overlap, so every run before the last one starting below
        # ``floor`` ends at or below it: one search instead of a step per run.
        start = max(bisect_left(stored, floor, runs.start) - 1, runs.start)
        if stored[start] + runs.counts[start] <= floor:
            start += 1
        if start > 1024 and start * 2 > len(stored):
            del stored[:start], runs.counts[:start], runs.offsets[:start]
            start = 0
        runs.start = start

    def _held(self, producer: int, sequence: int) -> Held | None:
        refused = self._refused.get(producer) if self._refused else None
        if refused is None or sequence <= refused:
            return None
        return Held(
            f"producer {producer:#x}: sequence {sequence} waits for sequence {refused}, "
            "refused here retriably, to be sent again first"
        )

    def refused(self, producer: int, sequences: Sequence[int]) -> None:
        """A run of ``producer`` with each of ``sequences`` (increasing) was
        refused retriably, not stored: hold its later runs back until the
        first of them not stored yet is sent again (module docstring)."""
        runs = self._producers.get(producer)
        stored_below = runs.next_sequence if runs is not None else 0
        missing = next((sequence for sequence in sequences if sequence >= stored_below), None)
        if missing is None:
            return  # retries of stored runs: nothing is missing
        known = self._refused.get(producer)
        if known is None or missing < known:
            self._refused[producer] = missing
            if len(self._refused) > self.max_producers:
                del self._refused[next(iter(self._refused))]

    def keep_refused(self, previous: ProducerWindow) -> None:
        """Carry ``previous``'s held producers over to this window, rebuilt
        from the log (a replica taking the lead): a run refused as a
        follower must still hold back the later ones queued behind it,
        unless the log now holds runs at or past it (the old leader's)."""
        for producer, sequence in previous._refused.items():
            runs = self._producers.get(producer)
            if runs is None or runs.next_sequence <= sequence:
                self._refused[producer] = sequence

    def forget(self, producers: set[int]) -> None:
        """Drop what is remembered of ``producers`` (an append of theirs failed,
        so what was recorded for it in advance may not be in the log)."""
        for producer in producers:
            self._producers.pop(producer, None)
        self._last = 0
