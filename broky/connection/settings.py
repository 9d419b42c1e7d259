"""What every connection of one broker shares: its protocol settings and its counters.

Kept apart from the connection handler so that the broker's configuration
(broky.config) and the liveness clocks can name the settings without
importing the whole connection machinery.
"""

from __future__ import annotations

from collections import Counter

import attrs

from broky.connection.liveness import TIMEOUT_JITTER
from broky.connection.reasons import CloseReason
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES


@attrs.frozen
class ConnectionSettings:
    """Per-connection protocol settings (from the broker's config)."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    heartbeat_interval: float = 10.0
    idle_timeout: float = 30.0
    handshake_timeout: float = 5.0
    #: Grace of a started frame before MIN_FRAME_BYTES_PER_SECOND applies.
    frame_timeout: float = 10.0
    #: Most a timeout fires late, as a fraction of it (see TIMEOUT_JITTER).
    timeout_jitter: float = TIMEOUT_JITTER
    #: Largest single message accepted (0: only the frame limit applies).
    max_message_bytes: int = 0
    #: This node's worker count, checked against cluster links' (0: unknown).
    workers: int = 0


@attrs.define(slots=True, eq=False)
class ConnectionCounters:
    """Counters shared by every connection of one broker."""

    opened: int = 0
    closed: Counter[CloseReason] = attrs.field(factory=Counter)
    bytes_received: int = 0
    bytes_sent: int = 0
    #: Socket writes made by a routing task for an idle writer (ConnectionWriter.write_directly).
    direct_writes: int = 0

    @property
    def current(self) -> int:
        """Connections open now."""
        return self.opened - sum(self.closed.values())
