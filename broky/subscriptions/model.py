"""The dispatcher's vocabulary: subscription types and options, consumers,
and the decisions a dispatcher emits for its driver (``broky.subscriptions.dispatch``).

Apart from the dispatcher so that the definition store, the consumers'
registry and the drivers can name these without the dispatcher's logic.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

import attrs

from broky.subscriptions.tracker import DEFAULT_LEASE

#: Parked offsets (messages read but held for a busy or draining slot) per
#: dispatcher before it stops reading new ones: offsets only, ~100 bytes each.
DEFAULT_MAX_PARKED: Final = 10_000


class SubscriptionType(Enum):
    EXCLUSIVE = "exclusive"
    FAILOVER = "failover"
    SHARED = "shared"
    KEY_SHARED = "key-shared"


class SubscriptionBusy(Exception):
    """A second consumer attached to an exclusive subscription."""


@attrs.frozen(slots=True)
class Options:
    """A subscription's settings (fixed at creation)."""

    type: SubscriptionType = SubscriptionType.SHARED
    ack_timeout: float = 30.0
    backoff: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0)
    #: Deliveries before a message is dead-lettered; 0 = never.
    max_deliveries: int = 10
    max_parked: int = DEFAULT_MAX_PARKED
    max_ack_ranges: int = 65536
    max_unacked: int = 100_000
    lease: int = DEFAULT_LEASE


@attrs.define(slots=True, hash=False)
class Deliver:
    """Deliver offsets ``[offset, stop)`` to ``consumer``, each for the
    ``count``-th time. A shared dispatcher deals consecutive offsets never
    delivered before as one span (one event, one pending delivery, one
    timer); an ordered one (``Dispatcher.feed_slots``) sends consecutive
    offsets fed to one consumer as one event, each its own pending delivery.

    Not frozen: a key-shared dispatcher builds one of these per run of a
    consumer's messages (often one message), and a frozen attrs class pays
    an ``object.__setattr__`` per field (about a third of a microsecond
    here); ``feed_slots`` also grows ``stop`` of the event it just made."""

    consumer: int
    offset: int
    count: int
    stop: int


@attrs.frozen(slots=True)
class DeadLetter:
    """Send ``offset`` to the dead-letter topic, then ``ack`` it here."""

    offset: int
    count: int
    error: str


@attrs.frozen(slots=True)
class Evict:
    """Close ``consumer``: it held messages and made no progress for twice the ack timeout."""

    consumer: int


Event = Deliver | DeadLetter | Evict


@attrs.define(slots=True, eq=False)
class Consumer:
    id: int
    priority: int
    credit: int
    max_in_flight: int
    in_flight: int = 0
    last_progress: float = 0.0

    @property
    def room(self) -> int:
        return min(self.credit, self.max_in_flight - self.in_flight)
