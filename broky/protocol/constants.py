"""Protocol constants and enumerations, mirroring ``schemas/broky.fbs``."""

from __future__ import annotations

import enum
from typing import Final

#: Every connection starts with these bytes from each side, then the version.
#: The NUL byte makes the preamble unmistakable for text protocols (HTTP) and
#: for TLS, whose first byte is 0x16.
MAGIC: Final = b"BROKY\x00"
PROTOCOL_VERSION: Final = 1
PREAMBLE_SIZE: Final = len(MAGIC) + 2

#: Default largest frame either side accepts. A frame is buffered whole before
#: it is decoded, so this bounds per-connection read memory; 4 MiB holds
#: ~30k messages of 100 bytes, far more than a useful batch, while keeping a
#: thousand connections with a frame in flight under 4 GiB.
DEFAULT_MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
#: The smallest maximum a peer may announce: room for any control frame.
MIN_MAX_FRAME_BYTES: Final = 64 * 1024
#: Longest key or pattern, in bytes. Keys are routing metadata, not data; a
#: bound keeps the match cache's memory predictable.
MAX_KEY_BYTES: Final = 1024
#: Length of a KSUID.
UID_BYTES: Final = 20


class BodyType(enum.IntEnum):
    """Union discriminant of ``Frame.body`` (0 is FlatBuffers' NONE)."""

    HELLO = 1
    WELCOME = 2
    PUBLISH = 3
    SUBSCRIBE = 4
    SUBSCRIBED = 5
    UNSUBSCRIBE = 6
    DELIVER = 7
    FLOW = 8
    PING = 9
    PONG = 10
    ERROR = 11
    NOTICE = 12
    PUBLISH_ACK = 13
    LIST_PARTITIONS = 14
    PARTITIONS = 15
    FETCH = 16
    FETCHED = 17
    CONSUME = 18
    REDELIVERED = 19
    SETTLE = 20
    SETTLED = 21
    DELETE_SUBSCRIPTION = 22
    DELETED_SUBSCRIPTION = 23


class ErrorCode(enum.IntEnum):
    """Wire error codes (``ErrorCode`` in the schema)."""

    INTERNAL = 0
    BAD_PREAMBLE = 1
    UNSUPPORTED_VERSION = 2
    MALFORMED_FRAME = 3
    FRAME_TOO_LARGE = 4
    INVALID_PATTERN = 5
    INVALID_KEY = 6
    DUPLICATE_STREAM = 7
    UNKNOWN_STREAM = 8
    SLOW_CONSUMER = 9
    IDLE_TIMEOUT = 10
    SERVER_SHUTDOWN = 11
    LIMIT_EXCEEDED = 12
    OFFSET_OUT_OF_RANGE = 13
    UNKNOWN_TOPIC = 14
    STORAGE_FAILURE = 15
    AUTHENTICATION_FAILED = 16
    PERMISSION_DENIED = 17
    OWNER_UNAVAILABLE = 18
    SUBSCRIPTION_REFUSED = 19
    NOT_LEADER = 20
    NOT_ENOUGH_REPLICAS = 21
    OUT_OF_ORDER_SEQUENCE = 22
    UNKNOWN_SUBSCRIPTION = 23
    SUBSCRIPTION_DELETED = 24
    SEQUENCE_GAP = 25


class SlowConsumerPolicy(enum.IntEnum):
    """What the broker does when a subscription's outbox is full."""

    DROP = 0
    DISCONNECT = 1


class LinkKind(enum.IntEnum):
    """Who opened a connection: a client, or another router (``Hello.link``)."""

    CLIENT = 0
    LOCAL = 1
    CLUSTER = 2
    DURABLE = 3


class NoticeKind(enum.IntEnum):
    """Kinds of ``Notice`` frame."""

    DROPPED = 0


class StartKind(enum.IntEnum):
    """Where a subscription starts reading a durable topic (``Subscribe.start``)."""

    LATEST = 0
    EARLIEST = 1
    OFFSET = 2
    TIME = 3
    LAST = 4


class SubscriptionKind(enum.IntEnum):
    """How a durable subscription's consumers share it (``Consume.kind``)."""

    SHARED = 0
    EXCLUSIVE = 1
    FAILOVER = 2
    KEY_SHARED = 3


class DeletePhase(enum.IntEnum):
    """``DeleteSubscription.phase``: a client's whole deletion, or one step
    of the two-phase deletion between a node's workers (schema)."""

    WHOLE = 0
    PREPARE = 1
    COMMIT = 2
    ABORT = 3


class AdoptSetting(enum.IntFlag):
    """``Consume.adopt_settings``: subscription settings a Consume leaves to
    an existing subscription (compared, and refused when they differ, unless
    adopted)."""

    ACK_TIMEOUT = 1
    MAX_DELIVERIES = 2
    BACKOFF = 4


class SettleKind(enum.IntEnum):
    """What a ``Settle`` frame does to its offsets."""

    ACK = 0
    NACK = 1
    TERM = 2
    IN_PROGRESS = 3
