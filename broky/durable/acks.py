"""Publish acknowledgements of one connection, released in frame order.

A Publish frame with ``ack`` set gets one ``PublishAck`` (batch-first: never
one per message) once every durable part of it reached its durability point.
Parts complete in any order (partitions have separate owners), but acks leave
in the order of the frames, so a client matches them by counting.

Idempotent producers: once a frame of a producer failed with the retriable
``OwnerUnavailable``, the producer's later frames on this connection are
refused the same way until it resends from the failed frame (a frame whose
first sequence is at or below it). Otherwise a later frame could be stored
before the retry of the failed one, and the retry would then be out of
order at the partition (``docs/protocol.md``).

Forwarded frames: a frame another worker of the node forwarded (its
connection is a ``Durable`` link) gathers runs of several clients and
producers, so one run's failure must not fail the others. Its ticket is
opened ``per_run``: a failure names its runs and is recorded as their
refusal, and the ack carries the stored runs' entries beside the refused
runs' codes (``PublishAck.refused_runs``); the forwarding worker hands each
outcome to its own client (broky.durable.forwarded).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import itemgetter

import attrs

from broky.compiled import compiled_twin
from broky.protocol.codec import encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Error, PublishAck
from broky.router.outbox import Outlet


@attrs.define(slots=True, eq=False)
class AckTicket:
    """One acked Publish frame: how many durable parts are still pending and
    the offsets the finished ones got, as columns (``entries`` zips them
    into ``(run index, partition, first, last)``): a part of a thousand
    one-message runs adds to four lists at C speed instead of building a
    tuple per run, and the ack is encoded from columns."""

    stream: int
    sequence: int
    #: The queue, for a ticket of an idempotent producer (None: not idempotent).
    queue: AckQueue | None = None
    producer: int = 0
    first_sequence: int = 0
    remaining: int = 0
    #: The finished runs' index in the frame, partition, first and last offset.
    run_indexes: list[int] = attrs.field(factory=list)
    partitions: list[int] = attrs.field(factory=list)
    firsts: list[int] = attrs.field(factory=list)
    lasts: list[int] = attrs.field(factory=list)
    failure: str = ""
    code: ErrorCode = ErrorCode.STORAGE_FAILURE
    #: A forwarded frame's ticket: failures refuse their runs only (module docstring).
    per_run: bool = False
    #: Refused runs of a ``per_run`` ticket, as ``(run index, code, reason)``.
    refusals: list[tuple[int, ErrorCode, str]] = attrs.field(factory=list)

    @property
    def entries(self) -> list[tuple[int, int, int, int]]:
        """The finished runs' ``(run index, partition, first, last)``, in the
        order they finished."""
        return list(zip(self.run_indexes, self.partitions, self.firsts, self.lasts, strict=True))

    def done(self, run_index: int, partition: int, first: int, last: int) -> None:
        """One pending part finished: a run stored at ``first`` to ``last``."""
        self.stored((run_index,), partition, (first,), (last,))

    def stored(
        self,
        run_indexes: Sequence[int],
        partition: int,
        firsts: Iterable[int],
        lasts: Iterable[int],
    ) -> None:
        """One pending part finished, every run of it stored in ``partition``:
        the runs' indexes in the frame and their first and last offsets."""
        self.run_indexes.extend(run_indexes)
        self.partitions.extend(repeat(partition, len(run_indexes)))
        self.firsts.extend(firsts)
        self.lasts.extend(lasts)
        self.remaining -= 1

    def completed(
        self,
        entries: list[tuple[int, int, int, int]],
        refusals: Sequence[tuple[int, ErrorCode, str]] = (),
    ) -> None:
        """One pending part finished: its runs' ``(run index, partition,
        first, last)`` entries (broky.durable.parts: a part of many runs),
        and the ``(run index, code, reason)`` of those it did not store.
        Without ``per_run``, any refusal fails the whole frame (nothing of
        a client's frame is acknowledged unless all of it is)."""
        if refusals and not self.per_run:
            _, code, reason = refusals[0]
            self.failed(reason, code)
            return
        for run_index, partition, first, last in entries:
            self.run_indexes.append(run_index)
            self.partitions.append(partition)
            self.firsts.append(first)
            self.lasts.append(last)
        self.refusals.extend(refusals)
        self.remaining -= 1

    def failed(
        self,
        reason: str,
        code: ErrorCode = ErrorCode.STORAGE_FAILURE,
        runs: Iterable[int] = (),
    ) -> None:
        """One pending part, of the frame's runs ``runs``, was not stored.
        A ``per_run`` ticket refuses those runs only (when named)."""
        if self.per_run:
            refusals = [(run, code, reason) for run in runs]
            if refusals:
                self.refusals.extend(refusals)
                self.remaining -= 1
                return
        if not self.failure:
            self.failure = reason
            self.code = code
        if code is ErrorCode.OWNER_UNAVAILABLE and self.queue is not None:
            self.queue.failed_retriably(self.producer, self.first_sequence)
        self.remaining -= 1

    def refuse(self, code: ErrorCode, reason: str) -> None:
        """Refuse the whole frame before any of it was stored (permissions, limits)."""
        self.code = code
        self.failure = reason


#: A PublishAck's entry columns: run indexes, partitions, first and last offsets.
AckColumns = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def ack_columns_pure(
    runs: list[int], partitions: list[int], firsts: list[int], lasts: list[int]
) -> AckColumns:
    """An ack's entries, given as columns, as a PublishAck's columns, in the
    order of the ``(run index, partition, first, last)`` tuples sorted.

    When no run index repeats (no run was split over partitions: the usual
    case) the run index alone decides the order, so the columns are put in
    the order of a sort of positions by run index (timsort merges the parts,
    each already in run order) and picked in C; otherwise the tuples are
    sorted, ties broken by partition and offsets as before.
    """
    columns = (runs, partitions, firsts, lasts)
    if len(runs) < 2 or len(set(runs)) != len(runs):
        entries = sorted(zip(*columns, strict=True))
        if not entries:
            return (), (), (), ()
        ordered = tuple(zip(*entries, strict=True))
    else:
        pick = itemgetter(*sorted(range(len(runs)), key=runs.__getitem__))
        ordered = tuple(map(pick, columns))
    return ordered[0], ordered[1], ordered[2], ordered[3]


#: The compiled twin (``broky.protocol._columns``) where it is built: the
#: same columns by a counting pass when no run index repeats, None otherwise.
ack_columns_compiled: (
    Callable[[list[int], list[int], list[int], list[int]], AckColumns | None] | None
) = compiled_twin("broky.protocol._columns", "ack_columns")


def ack_columns(ticket: AckTicket) -> AckColumns:
    """The ticket's entries as a PublishAck's columns (``ack_columns_pure``),
    by the compiled counting pass where it applies."""
    columns = (ticket.run_indexes, ticket.partitions, ticket.firsts, ticket.lasts)
    if ack_columns_compiled is not None:
        ordered = ack_columns_compiled(*columns)
        if ordered is not None:
            return ordered
    return ack_columns_pure(*columns)


#: Who waits for a queued run's durability: the acked frame's ticket, its
#: connection's ack queue and the run's index in the frame.
AckSlot = tuple[AckTicket, "AckQueue", int]


class AckQueue:
    """The acked Publish frames of one connection that await their acks."""

    def __init__(self, outlet: Outlet) -> None:
        self._outlet = outlet
        self._tickets: deque[AckTicket] = deque()
        self._sequence = 0
        #: Per producer, the first sequence of its oldest frame that failed
        #: retriably and was not resent yet (module docstring).
        self._resend_from: dict[int, int] = {}

    def open(self, stream: int, producer: int = 0, first_sequence: int = 0) -> AckTicket:
        """A ticket for the next acked Publish frame; ``release`` after filling it."""
        self._sequence += 1
        if producer:
            ticket = AckTicket(stream, self._sequence, self, producer, first_sequence)
        else:
            ticket = AckTicket(stream, self._sequence)
        self._tickets.append(ticket)
        return ticket

    def failed_retriably(self, producer: int, first_sequence: int) -> None:
        """A frame of ``producer`` failed with OwnerUnavailable."""
        known = self._resend_from.get(producer)
        if known is None or first_sequence < known:
            self._resend_from[producer] = first_sequence

    def resend_needed(self, producer: int, first_sequence: int) -> int | None:
        """The sequence ``producer`` must resend from before a frame starting
        at ``first_sequence`` may be stored (None: it may). A frame at or
        below it is the resend, and clears the condition."""
        resend_from = self._resend_from.get(producer)
        if resend_from is None:
            return None
        if first_sequence <= resend_from:
            del self._resend_from[producer]
            return None
        return resend_from

    def release(self) -> None:
        """Send the acks (or errors) of every finished frame at the front."""
        tickets = self._tickets
        outlet = self._outlet
        while tickets and tickets[0].remaining <= 0:
            ticket = tickets.popleft()
            if ticket.failure:
                outlet.send_control(encode_frame(Error(ticket.code, ticket.failure, ticket.stream)))
                continue
            runs, partitions, firsts, lasts = ack_columns(ticket)
            refusals = sorted(ticket.refusals)
            refused, codes, reasons = zip(*refusals, strict=True) if refusals else ((), (), ())
            outlet.send_control(
                encode_frame(
                    PublishAck(
                        stream=ticket.stream,
                        sequence=ticket.sequence,
                        runs=runs,
                        partitions=partitions,
                        first_offsets=firsts,
                        last_offsets=lasts,
                        refused_runs=refused,
                        refused_codes=codes,
                        refused_reasons=reasons,
                    )
                )
            )
