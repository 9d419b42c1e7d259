"""A group-commit round's parts: sorted before the append, answered after.

Sans-IO, used by a partition's owner (broky.durable.owner) for every round.
Before the append, each part of an idempotent producer (broky.durable.parts)
is checked against the partition's :class:`ProducerWindow`: a part whose
first sequence is past what the partition stored of its producer is new as
a whole (one lookup, the usual case); any other part is checked run by run,
its new runs go to the append and its retries and runs out of order are
kept out of it (an *answered* part). The window is told about the new runs
at once, at the offsets the append will give them (the owner is the only
writer, so they follow the log's end offset), so a second copy of a run in
the same round is a duplicate too. After the append, ``settle`` answers the
runs kept out; if the append did not store the round where the window was
told (a failed write), the round's producers are forgotten (their next runs
count as new) and duplicates of the round's own runs fail like the runs
themselves.

Acks: a part is one of its ticket's pending pieces. A part split into
appended and answered runs becomes two, so its ticket waits for one more.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from broky.durable.acks import AckQueue
from broky.durable.parts import Part
from broky.durable.producers import Duplicate, Held, OutOfOrder, ProducerWindow
from broky.durable.replica_gate import ReplicaGate
from broky.protocol.constants import ErrorCode


@attrs.frozen(slots=True)
class Answered:
    """The runs of one part kept out of the append, with their verdicts:
    ``(run index, message count, verdict)`` each."""

    part: Part
    verdicts: list[tuple[int, int, Duplicate | OutOfOrder | Held]]
    nbytes: int
    runs: int


class RoundPlan:
    """The parts of one round to append (``parts``) and the runs to answer
    without appending (``answered``)."""

    def __init__(self, window: ProducerWindow, end_offset: int, parts: Sequence[Part]) -> None:
        self._window = window
        #: Where the append must put the first kept run.
        self.first_offset = end_offset
        self.answered: list[Answered] = []
        self.parts: list[Part] = []
        #: Producers of the kept parts (forgotten if the append fails).
        self._producers: set[int] = set()
        offset = end_offset
        for part in parts:
            kept = self._admit(part, offset)
            if kept is not None:
                self.parts.append(kept)
                offset += kept.messages

    def _admit(self, part: Part, offset: int) -> Part | None:
        """The runs of ``part`` to append from ``offset`` (None: none),
        answering the others."""
        producer = part.producer
        if not producer:
            return part
        if self._window.admit_all(producer, part.sequences, part.counts, offset):
            self._producers.add(producer)
            return part
        kept = self._sort(part, offset)
        if kept is not None:
            self._producers.add(producer)
        return kept

    def _sort(self, part: Part, offset: int) -> Part | None:
        """Check ``part`` run by run; the part of its new runs (None: none)."""
        admit = self._window.admit
        kept: list[int] = []
        verdicts: list[tuple[int, int, Duplicate | OutOfOrder | Held]] = []
        nbytes = 0
        for position, (run, sequence) in enumerate(zip(part.runs, part.sequences, strict=True)):
            verdict = admit(part.producer, sequence, run.count, offset)
            if verdict is None:
                kept.append(position)
                offset += run.count
            else:
                verdicts.append((part.indexes[position], run.count, verdict))
                nbytes += len(run.messages)
        if not verdicts:
            return part
        self.answered.append(Answered(part, verdicts, nbytes, len(verdicts)))
        if not kept:
            return None
        if part.ticket is not None:
            part.ticket.remaining += 1  # settled twice: appended and answered
        return part.split(kept)

    @property
    def answered_bytes(self) -> int:
        return sum(answer.nbytes for answer in self.answered)

    @property
    def answered_runs(self) -> int:
        return sum(answer.runs for answer in self.answered)

    def answer(
        self,
        outcome: int | Exception | None,
        partition: int,
        where: str,
        replica: ReplicaGate | None,
        end_offset: int,
    ) -> None:
        """Answer the runs kept out of the append: retries at their original
        offsets, out-of-order runs refused. On a replicated partition a
        retry is acked only once the high watermark passes ``end_offset``
        (the log's end as the round left it; its original lies below), so
        it is never acknowledged before its original is."""
        if replica is None or not self.answered or isinstance(outcome, Exception):
            for queue in self.settle(outcome, partition, where):
                queue.release()
            return

        def deliver() -> None:
            for queue in self.settle(outcome, partition, where):
                queue.release()

        def fail(code: ErrorCode, reason: str) -> None:
            for queue in self.fail(code, f"{where}: {reason}"):
                queue.release()

        replica.hold(end_offset, [], [], deliver, fail)

    def fail(self, code: ErrorCode, reason: str) -> set[AckQueue]:
        """Fail the tickets of the answered runs (a replicated partition's
        leader lost the lead, or its ISR, before it could acknowledge them);
        the ack queues to release."""
        queues: set[AckQueue] = set()
        for answer in self.answered:
            part = answer.part
            if part.ticket is not None and part.acks is not None:
                # The answered runs only: the part's kept runs fail on their own.
                part.ticket.failed(reason, code, [index for index, _, _ in answer.verdicts])
                queues.add(part.acks)
        return queues

    def settle(self, outcome: int | Exception | None, partition: int, where: str) -> set[AckQueue]:
        """Complete the tickets of the answered runs, given the append's
        outcome (its first offset, or the exception); the ack queues to release."""
        stored = not self.parts or outcome == self.first_offset
        if not stored:
            self._window.forget(self._producers)
        queues: set[AckQueue] = set()
        for answer in self.answered:
            part = answer.part
            ticket = part.ticket
            if ticket is None or part.acks is None:
                continue
            queues.add(part.acks)
            entries = []
            refusals: list[tuple[int, ErrorCode, str]] = []
            for run_index, count, verdict in answer.verdicts:
                if isinstance(verdict, OutOfOrder | Held):
                    code = (
                        ErrorCode.OUT_OF_ORDER_SEQUENCE
                        if isinstance(verdict, OutOfOrder)
                        else ErrorCode.SEQUENCE_GAP
                    )
                    refusals.append((run_index, code, f"{where}: {verdict.reason}"))
                elif not stored:
                    refusals.append(
                        (
                            run_index,
                            ErrorCode.STORAGE_FAILURE,
                            f"could not store {where}: {outcome}",
                        )
                    )
                else:
                    first = verdict.first_offset
                    entries.append((run_index, partition, first, first + count - 1))
            ticket.completed(entries, refusals)
        return queues
