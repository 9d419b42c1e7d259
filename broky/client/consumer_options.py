"""The options of ``Client.consumer``: checked once, in seconds and words for
the application, turned into the ``Consume`` frame's milliseconds and enums.

Kept apart from ``consumer.py`` so that the client module can name the
options' type (``ConsumerSettings``) without importing the consumer's
machinery, and so that every check sits in one place with its message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, TypedDict

import attrs

from broky.client.durable import Start
from broky.protocol.constants import AdoptSetting, ErrorCode, SubscriptionKind
from broky.protocol.frames import Consume
from broky.protocol.keys import encode_key

SubscriptionType = Literal["exclusive", "failover", "shared", "key-shared"]

_KINDS: Final[dict[str, SubscriptionKind]] = {
    "exclusive": SubscriptionKind.EXCLUSIVE,
    "failover": SubscriptionKind.FAILOVER,
    "shared": SubscriptionKind.SHARED,
    "key-shared": SubscriptionKind.KEY_SHARED,
}
#: The longest subscription name the broker accepts (schema: 1-200 bytes).
MAX_SUBSCRIPTION_BYTES: Final = 200
#: Default seconds between ack flushes: a batch waits at most this long
#: before it is sent, about one broker group commit (5 ms), so acks cost a
#: frame per commit, not one per message.
ACK_INTERVAL: Final = 0.005
#: Default outcomes per batch: a batch this big is sent at once, without
#: waiting for the timer (a fast consumer sends a frame per 1,024 acks).
ACK_BATCH: Final = 1024


class ConsumerSettings(TypedDict, total=False):
    """Keyword options of ``Client.consumer`` after ``subscription`` and ``type``.

    Times are in seconds. Which of them a broker uses for an existing
    subscription follows docs/protocol.md (``Consume``): the type, start
    position and redelivery settings (``ack_timeout``, ``backoff``,
    ``max_deliveries``) are fixed when the subscription is created (passed
    with other values, the attach is refused; left out, the subscription's
    are used); the rest are per consumer.
    """

    #: Where a new subscription starts (default ``Start.latest()``).
    start: Start | None
    #: Messages the broker may send before this consumer takes them (its
    #: prefetch window); credit is granted back as the application iterates.
    credit: int
    #: Unacked messages this consumer may hold before the broker stops sending.
    max_in_flight: int
    #: Seconds before an unacked delivery is redelivered (> 0).
    ack_timeout: float
    #: Redelivery delays in seconds after the n-th delivery (the last repeats),
    #: for timeouts and for ``nack()`` without a delay.
    backoff: Sequence[float]
    #: Deliveries before a message goes to the dead-letter topic; 0: never.
    max_deliveries: int
    #: Failover: the higher, the sooner this consumer is the active one.
    priority: int
    #: The ``[[durable]]`` topic that receives dead letters (fixed when the
    #: subscription is created; "" or absent: the default ``_dlq`` keys).
    dead_letter_topic: str
    #: Seconds an ack may wait in the client before it is sent.
    ack_interval: float
    #: Outcomes that make a batch be sent at once.
    ack_batch: int


@attrs.frozen
class ConsumerOptions:
    """Checked options, ready for the ``Consume`` frame."""

    subscription: str
    pattern: bytes
    kind: SubscriptionKind
    start: Start
    credit: int
    max_in_flight: int
    ack_timeout_ms: int
    backoff_ms: tuple[int, ...]
    max_deliveries: int
    priority: int
    dead_letter_topic: str
    ack_interval: float
    ack_batch: int
    #: ``AdoptSetting`` bits of the redelivery settings the caller did not
    #: pass: an existing subscription's values are taken for them.
    adopt_settings: int = 0

    def consume(self, stream: int) -> Consume:
        """The frame that attaches a consumer with these options on ``stream``."""
        return Consume(
            stream=stream,
            subscription=self.subscription,
            pattern=self.pattern,
            kind=self.kind,
            start=self.start.kind,
            credit=self.credit,
            max_in_flight=self.max_in_flight,
            ack_timeout_ms=self.ack_timeout_ms,
            max_deliveries=self.max_deliveries,
            backoff_ms=self.backoff_ms,
            priority=self.priority,
            start_time=self.start.time_ns,
            start_offsets=self.start.offsets,
            dead_letter_topic=self.dead_letter_topic,
            adopt_settings=self.adopt_settings,
        )


#: The redelivery settings a consumer joins with the subscription's values
#: unless its caller passed them (a default is not a choice: see
#: broky.subscriptions.definition).
_ADOPTED_UNLESS_GIVEN: Final = {
    "ack_timeout": AdoptSetting.ACK_TIMEOUT,
    "max_deliveries": AdoptSetting.MAX_DELIVERIES,
    "backoff": AdoptSetting.BACKOFF,
}


def _milliseconds(seconds: float, what: str) -> int:
    if not 0 <= seconds <= 2**32 / 1000 - 1:
        raise ValueError(f"{what} must be between 0 and {2**32 // 1000 - 1} s, got {seconds}")
    return round(seconds * 1000)


def _count(value: int, what: str, least: int) -> int:
    if not least <= value < 2**32:
        raise ValueError(f"{what} must be between {least} and {2**32 - 1}, got {value}")
    return value


def _priority(value: int) -> int:
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"priority must fit in 32 bits (the wire's int32), got {value}")
    return value


def _topic_name(name: str) -> str:
    if len(name.encode("utf-8", "surrogatepass")) > MAX_SUBSCRIPTION_BYTES or (
        name and not name.isprintable()
    ):
        raise ValueError(
            f"dead_letter_topic must be a durable topic's name (printable, at most "
            f"{MAX_SUBSCRIPTION_BYTES} bytes), got {name!r}"
        )
    return name


def consumer_options(
    pattern: str, subscription: str, type: str, settings: ConsumerSettings
) -> ConsumerOptions:
    """Check what ``Client.consumer`` was given; ValueError names the wrong option.

    A pattern with a control character or whitespace raises
    LocalProtocolError, as ``subscribe`` does.
    """
    kind = _KINDS.get(type)
    if kind is None:
        raise ValueError(f"type must be one of {', '.join(_KINDS)}, got {type!r}")
    name_bytes = len(subscription.encode("utf-8", "surrogatepass"))
    if not 1 <= name_bytes <= MAX_SUBSCRIPTION_BYTES or not subscription.isprintable():
        raise ValueError(
            f"subscription must be 1-{MAX_SUBSCRIPTION_BYTES} bytes of printable UTF-8, "
            f"got {subscription!r}"
        )
    ack_timeout_ms = _milliseconds(settings.get("ack_timeout", 30.0), "ack_timeout")
    if ack_timeout_ms < 1:
        raise ValueError("ack_timeout must be at least 1 ms: unacked messages need a timeout")
    ack_interval = settings.get("ack_interval", ACK_INTERVAL)
    if not 0 <= ack_interval <= 60:
        raise ValueError(f"ack_interval must be between 0 and 60 s, got {ack_interval}")
    return ConsumerOptions(
        subscription=subscription,
        pattern=encode_key(pattern, ErrorCode.INVALID_PATTERN),
        kind=kind,
        start=settings.get("start") or Start(),
        credit=_count(settings.get("credit", 1000), "credit", 1),
        max_in_flight=_count(settings.get("max_in_flight", 1000), "max_in_flight", 1),
        ack_timeout_ms=ack_timeout_ms,
        backoff_ms=tuple(_milliseconds(delay, "backoff") for delay in settings.get("backoff", ())),
        max_deliveries=_count(settings.get("max_deliveries", 10), "max_deliveries", 0),
        priority=_priority(settings.get("priority", 0)),
        dead_letter_topic=_topic_name(settings.get("dead_letter_topic", "")),
        ack_interval=ack_interval,
        ack_batch=_count(settings.get("ack_batch", ACK_BATCH), "ack_batch", 1),
        adopt_settings=sum(
            bit for key, bit in _ADOPTED_UNLESS_GIVEN.items() if key not in settings
        ),
    )
