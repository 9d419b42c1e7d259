"""One attached consumer as the subscription service sees it, and the
per-subscription counters.

A :class:`ConsumerLink` is what a ``Consume`` frame creates: the stream it
arrived on, the connection's outlet (where deliveries are queued), and one
:class:`~broky.subscriptions.model.Consumer` state shared by the
dispatchers of every partition it reads, so that its credit and
``max_in_flight`` bound the consumer as a whole.

A link whose ``answers`` is set is one part of a consumer spread over the
workers of a node (broky.durable.consumer_relays): what it would send to
the connection (confirmation, errors, deliveries, receipts) goes to
``answers`` instead, which combines the parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from broky.protocol.codec import encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Error, Settled, Subscribed
from broky.router.outbox import Outlet
from broky.subscriptions.model import Consumer


class ConsumerAnswers(Protocol):
    """Where a part of a spread consumer sends what a link would send."""

    def subscribed(self) -> None: ...

    def failed(self, code: ErrorCode, message: str) -> None: ...

    def delivered_frames(self, frames: Sequence[bytes]) -> None: ...

    def settled(self, sequence: int, stale: int, unconfirmed: int) -> None: ...


@attrs.define(slots=True, eq=False)
class ConsumerLink:
    """See the module docstring."""

    id: int
    stream: int
    subscription: str
    outlet: Outlet
    state: Consumer
    #: The (topic, partition) pairs it is attached to.
    partitions: list[tuple[str, int]] = attrs.field(factory=list)
    #: Detached (closed, evicted or its connection ended): sends nothing more.
    closed: bool = False
    #: Set for a part of a spread consumer (module docstring).
    answers: ConsumerAnswers | None = None
    #: The topic the stream's last ``Redelivered`` named, which the client
    #: gives to every ``Deliver`` after it (None: none named yet). Deliveries
    #: of another topic must name theirs first (``delivery_frames``).
    named_topic: str | None = None

    @property
    def max_frame_bytes(self) -> int:
        return self.outlet.max_frame_bytes

    def send(self, frames: Sequence[bytes]) -> None:
        """Queue delivery frames, in order, unless the consumer is gone."""
        if frames and not self.closed:
            if self.answers is not None:
                self.answers.delivered_frames(frames)
            else:
                self.outlet.send_control(b"".join(frames))

    def error(self, code: ErrorCode, message: str) -> None:
        """A stream error on the consumer's stream (the connection stays)."""
        if self.answers is not None:
            self.answers.failed(code, message)
        else:
            self.outlet.send_control(encode_frame(Error(code, message, self.stream)))

    def subscribed(self) -> None:
        """The consumer is attached: ``Subscribed``."""
        if self.answers is not None:
            self.answers.subscribed()
        else:
            self.outlet.send_control(encode_frame(Subscribed(self.stream)))

    def settled(self, sequence: int, stale: int, unconfirmed: int = 0) -> None:
        """A settle's receipt: its changes are committed (but for
        ``unconfirmed`` offsets it could not apply)."""
        if self.answers is not None:
            self.answers.settled(sequence, stale, unconfirmed)
        else:
            self.outlet.send_control(
                encode_frame(Settled(self.stream, sequence, stale, unconfirmed))
            )


class Refused(Exception):
    """A Consume or a deletion is refused: ``code`` and a message saying
    whose fault it is (sent as a stream error)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.define(slots=True)
class SubscriptionCounters:
    """Totals of one subscription on this worker since it started."""

    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    stale_acks: int = 0
    dead_lettered: int = 0
    evicted: int = 0
    #: Unacked messages that retention removed from the log.
    lost_to_retention: int = 0
