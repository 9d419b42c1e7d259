"""Publish acknowledgements of one connection, released in frame order.

A Publish frame with ``ack`` set gets one ``PublishAck`` (batch-first: never
one per message) once every durable part of it reached its durability point.
Parts complete in any order (partitions have separate owners), but acks leave
in the order of the frames, so a client matches them by counting.
"""

from __future__ import annotations

from collections import deque

import attrs

from broky.protocol.codec import encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Error, PublishAck
from broky.router.outbox import Outlet


@attrs.define(slots=True, eq=False)
class AckTicket:
    """One acked Publish frame: how many durable parts are still pending and
    the offsets the finished ones got, as ``(run index, partition, first, last)``."""

    stream: int
    sequence: int
    remaining: int = 0
    entries: list[tuple[int, int, int, int]] = attrs.field(factory=list)
    failure: str = ""
    code: ErrorCode = ErrorCode.STORAGE_FAILURE

    def done(self, run_index: int, partition: int, first: int, last: int) -> None:
        self.entries.append((run_index, partition, first, last))
        self.remaining -= 1

    def failed(self, reason: str, code: ErrorCode = ErrorCode.STORAGE_FAILURE) -> None:
        if not self.failure:
            self.failure = reason
            self.code = code
        self.remaining -= 1

    def refuse(self, code: ErrorCode, reason: str) -> None:
        """Refuse the whole frame before any of it was stored (permissions, limits)."""
        self.code = code
        self.failure = reason


class AckQueue:
    """The acked Publish frames of one connection that await their acks."""

    def __init__(self, outlet: Outlet) -> None:
        self._outlet = outlet
        self._tickets: deque[AckTicket] = deque()
        self._sequence = 0

    def open(self, stream: int) -> AckTicket:
        """A ticket for the next acked Publish frame; ``release`` after filling it."""
        self._sequence += 1
        ticket = AckTicket(stream, self._sequence)
        self._tickets.append(ticket)
        return ticket

    def release(self) -> None:
        """Send the acks (or errors) of every finished frame at the front."""
        tickets = self._tickets
        outlet = self._outlet
        while tickets and tickets[0].remaining <= 0:
            ticket = tickets.popleft()
            if ticket.failure:
                outlet.send_control(encode_frame(Error(ticket.code, ticket.failure, ticket.stream)))
                continue
            entries = sorted(ticket.entries)
            outlet.send_control(
                encode_frame(
                    PublishAck(
                        stream=ticket.stream,
                        sequence=ticket.sequence,
                        runs=tuple(entry[0] for entry in entries),
                        partitions=tuple(entry[1] for entry in entries),
                        first_offsets=tuple(entry[2] for entry in entries),
                        last_offsets=tuple(entry[3] for entry in entries),
                    )
                )
            )
