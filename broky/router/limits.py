"""The router's bounds: per-subscription outboxes, per-connection state.

Apart from the router so that configuration (broky.config) can build them
without the router's machinery, and so that the router module stays the
routing itself.
"""

from __future__ import annotations

from typing import Final

import attrs

from broky.observability.topics import DEFAULT_TOP_TOPICS
from broky.router.outbox import (
    DEFAULT_OUTBOX_BYTES,
    DEFAULT_OUTBOX_MESSAGES,
    DEFAULT_WRITE_BATCH_BYTES,
)

#: Most subscriptions one connection may hold; bounds per-connection state.
DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION: Final = 10_000
#: Outbox bound of a peer router's link subscription: larger than a client's
#: because one link carries what many subscribers on the other side want;
#: 16 MiB is ~100k messages of 100 bytes, ~50 ms of a saturated link.
DEFAULT_LINK_OUTBOX_BYTES: Final = 16 * 1024 * 1024
DEFAULT_LINK_OUTBOX_MESSAGES: Final = 1_000_000


@attrs.frozen
class RouterLimits:
    """Per-subscription and per-connection bounds applied by the router."""

    outbox_messages: int = DEFAULT_OUTBOX_MESSAGES
    outbox_bytes: int = DEFAULT_OUTBOX_BYTES
    write_batch_bytes: int = DEFAULT_WRITE_BATCH_BYTES
    max_subscriptions_per_connection: int = DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION
    #: Bytes queued for one client connection across its subscriptions (0: no bound).
    max_pending_bytes: int = 0
    link_outbox_messages: int = DEFAULT_LINK_OUTBOX_MESSAGES
    link_outbox_bytes: int = DEFAULT_LINK_OUTBOX_BYTES
    #: How many of the busiest keys the router reports (K; see TopicCounter).
    top_topics: int = DEFAULT_TOP_TOPICS
