"""A group-commit round's idempotent runs: sorted before the append, answered after.

Sans-IO, used by a partition's owner (broky.durable.store) for rounds that
hold runs of idempotent producers. Before the append, each such run is
checked against the partition's :class:`ProducerWindow`: new runs go to the
append, retries of stored runs and runs out of order are kept out of it.
The window is told about the new runs at once, at the offsets the append
will give them (the owner is the only writer, so they follow the log's end
offset), so a second copy of a run in the same round is a duplicate too.
After the append, ``settle`` answers the runs kept out; if the append did
not store the round where the window was told (a failed write), the round's
producers are forgotten (their next runs count as new) and duplicates of
the round's own runs fail like the runs themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from broky.durable.acks import AckQueue, AckSlot
from broky.durable.producers import Duplicate, Identity, OutOfOrder, ProducerWindow
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Run


@attrs.frozen(slots=True)
class Answered:
    """A run kept out of the append: who waits, its size and the verdict."""

    slot: AckSlot | None
    nbytes: int
    count: int
    verdict: Duplicate | OutOfOrder


class RoundPlan:
    """The runs of one round to append (``runs``, ``stamps``, ``acks``,
    ``identities``: parallel lists, (0, 0) for runs without a producer) and
    those to answer without appending (``answered``)."""

    def __init__(
        self,
        window: ProducerWindow,
        end_offset: int,
        runs: Sequence[Run],
        stamps: Sequence[int],
        acks: Sequence[AckSlot | None],
        identities: Sequence[Identity | None],
    ) -> None:
        self._window = window
        #: Where the append must put the first kept run.
        self.first_offset = end_offset
        self.answered: list[Answered] = []
        answered_at: set[int] = set()
        offset = end_offset
        admit = window.admit
        for index, (run, identity) in enumerate(zip(runs, identities, strict=True)):
            if identity is not None:
                verdict = admit(identity[0], identity[1], run.count, offset)
                if verdict is not None:
                    answered_at.add(index)
                    self.answered.append(
                        Answered(acks[index], len(run.messages), run.count, verdict)
                    )
                    continue
            offset += run.count
        # The usual round has every run new: its lists are taken as they are.
        kept = [i for i in range(len(runs)) if i not in answered_at] if answered_at else None
        self.runs = list(runs) if kept is None else [runs[i] for i in kept]
        self.stamps = list(stamps) if kept is None else [stamps[i] for i in kept]
        self.acks = list(acks) if kept is None else [acks[i] for i in kept]
        chosen = identities if kept is None else [identities[i] for i in kept]
        self.identities: list[Identity] = [
            (0, 0) if identity is None else identity for identity in chosen
        ]

    @property
    def answered_bytes(self) -> int:
        return sum(answer.nbytes for answer in self.answered)

    def fail(self, code: ErrorCode, reason: str) -> set[AckQueue]:
        """Fail the tickets of the answered runs (a replicated partition's
        leader lost the lead, or its ISR, before it could acknowledge them);
        the ack queues to release."""
        queues: set[AckQueue] = set()
        for answer in self.answered:
            if answer.slot is not None:
                ticket, queue, _ = answer.slot
                ticket.failed(reason, code)
                queues.add(queue)
        return queues

    def settle(self, outcome: int | Exception | None, partition: int, where: str) -> set[AckQueue]:
        """Complete the tickets of the answered runs, given the append's
        outcome (its first offset, or the exception); the ack queues to release."""
        stored = not self.runs or outcome == self.first_offset
        if not stored:
            self._window.forget({producer for producer, _ in self.identities if producer})
        queues: set[AckQueue] = set()
        for answer in self.answered:
            if answer.slot is None:
                continue
            ticket, queue, run_index = answer.slot
            queues.add(queue)
            verdict = answer.verdict
            if isinstance(verdict, OutOfOrder):
                ticket.failed(f"{where}: {verdict.reason}", ErrorCode.OUT_OF_ORDER_SEQUENCE)
            elif stored:
                first = verdict.first_offset
                ticket.done(run_index, partition, first, first + answer.count - 1)
            else:
                ticket.failed(f"could not store {where}: {outcome}", ErrorCode.STORAGE_FAILURE)
        return queues
