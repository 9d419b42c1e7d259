"""Typed, immutable frames: what the codec decodes to and encodes from.

Control frames are frozen attrs classes. ``Run`` is the hot-path unit: the
decoder hands out its ``sizes`` and ``messages`` as zero-copy views into the
received bytes (the compiled reader copies a run of a few hundred bytes
instead: cheaper than three views, broky.protocol._forward), so a run must be
consumed (copied or forwarded) before the buffer it views is reused; ``bytes``
objects from the socket are immutable, so holding a view is always safe, it
only keeps that buffer alive.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeAlias

import attrs

from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    DeletePhase,
    ErrorCode,
    LinkKind,
    NoticeKind,
    SettleKind,
    SlowConsumerPolicy,
    StartKind,
    SubscriptionKind,
)

Buffer: TypeAlias = bytes | bytearray | memoryview


@attrs.frozen(slots=True)
class Run:
    """Consecutive messages with one key, as carried by Publish and Deliver.

    ``sizes`` is the little-endian uint32 size table and ``messages`` the
    message FlatBuffers back to back; ``count`` is ``len(sizes) // 4``.
    A run read from a durable topic's log also says where it lives: its
    ``partition`` and the offset of its first message (``base_offset``,
    -1 for an ephemeral run, which has no offsets).
    """

    key: bytes
    ts_broker: int
    count: int
    sizes: Buffer
    messages: Buffer
    partition: int = 0
    base_offset: int = -1
    #: The run's bytes in the frame it was decoded from, when they are laid
    #: out exactly as ``encode_run_chunk`` lays out a chunk (a view, like
    #: ``sizes``): the broker forwards a copy instead of encoding the run
    #: again. None for a run built in memory or laid out otherwise; it never
    #: takes part in equality (it is a by-product of the layout, not data).
    chunk: Buffer | None = attrs.field(default=None, eq=False, repr=False)


@attrs.define(slots=True)
class EncodedRun:
    """A run as the broker forwards it: its key, message count and chunk
    (see ``broky.protocol.chunks``).

    Not frozen: a frozen attrs class pays an ``object.__setattr__`` per field
    on construction, and on short runs one of these is built per message.
    Nothing mutates one after it is built.

    This is the pure-Python class (``EncodedRunPure``); where the compiled
    hot path is built, ``EncodedRun`` is its twin ``broky.protocol._runs``
    (same fields, equality and repr), which the compiled reader and fan-out
    fill and read as C fields.
    """

    key: bytes
    count: int
    chunk: bytes


EncodedRunPure = EncodedRun


def _compiled_encoded_run() -> type[EncodedRun] | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.protocol._runs import EncodedRun as compiled  # noqa: PLC0415
    except ImportError:
        return None
    return compiled  # type: ignore[return-value]  # the twin, not a subclass


if not TYPE_CHECKING:
    EncodedRun = _compiled_encoded_run() or EncodedRunPure


@attrs.frozen(slots=True)
class Hello:
    """Client's opening frame."""

    protocol_version: int = PROTOCOL_VERSION
    client_name: str = ""
    max_frame_bytes: int = 0
    link: LinkKind = LinkKind.CLIENT
    node: str = ""
    #: Credentials: ``user`` with ``password``, or ``token`` alone; all empty: anonymous.
    user: str = ""
    password: str = attrs.field(default="", repr=False)
    token: str = attrs.field(default="", repr=False)
    #: The connecting node's worker count (cluster links; 0: unknown).
    workers: int = 0


@attrs.frozen(slots=True)
class Welcome:
    """Broker's answer to Hello."""

    protocol_version: int = PROTOCOL_VERSION
    server_name: str = ""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    heartbeat_interval_ms: int = 0
    idle_timeout_ms: int = 0
    #: Largest single message the broker accepts (0: only the frame limit).
    max_message_bytes: int = 0
    #: Who the broker authenticated the connection as ("": anonymous).
    principal: str = ""


@attrs.frozen(slots=True)
class Publish:
    """A batch of runs published on one publish stream."""

    stream: int
    runs: tuple[Run, ...]
    stamp_ts_broker: bool = False
    #: Ask for a PublishAck once the frame's durable runs reach their durability point.
    ack: bool = False
    #: Idempotent publishing: the producer (0: none) and the sequence of the
    #: frame's first message (message i has ``first_sequence + i``).
    producer_id: int = 0
    first_sequence: int = 0
    #: Broker-internal forwarding: each run's producer and first sequence
    #: (empty: taken from ``producer_id`` and ``first_sequence``).
    run_producers: tuple[int, ...] = ()
    run_sequences: tuple[int, ...] = ()

    def run_identities(self) -> list[tuple[int, int]] | None:
        """``(producer id, sequence of its first message)`` of each run, or
        None when the frame has no producer (not idempotent)."""
        if self.run_producers:
            return list(zip(self.run_producers, self.run_sequences, strict=True))
        if not self.producer_id:
            return None
        identities = []
        sequence = self.first_sequence
        for run in self.runs:
            identities.append((self.producer_id, sequence))
            sequence += run.count
        return identities


@attrs.frozen(slots=True)
class ForwardPublish:
    """Publish frames the broker routes as they arrived: not frames on the
    wire but how a server's ``ProtocolMachine`` (with ``forward_publish``
    set) hands over consecutive unacked Publish frames of one stream whose
    runs are all laid out as chunks, read without decoding each run.
    """

    stream: int
    runs: list[EncodedRun]


@attrs.frozen(slots=True)
class Subscribe:
    """Open a subscription on ``stream``."""

    stream: int
    pattern: bytes
    slow_consumer: SlowConsumerPolicy = SlowConsumerPolicy.DROP
    credit: int = 0
    #: Where durable topics matching the pattern start (ephemeral keys are always live).
    start: StartKind = StartKind.LATEST
    #: ``StartKind.TIME``: ns since the epoch.
    start_time: int = 0
    #: ``StartKind.OFFSET``: the start offset of partition i at index i.
    start_offsets: tuple[int, ...] = ()
    #: Non-empty: the queue group joined (each message to one member).
    queue: bytes = b""


@attrs.frozen(slots=True)
class Subscribed:
    """The broker's confirmation that a subscription is active."""

    stream: int


@attrs.frozen(slots=True)
class Unsubscribe:
    """Close a subscription."""

    stream: int


@attrs.frozen(slots=True)
class Deliver:
    """Runs delivered to one subscription."""

    stream: int
    runs: tuple[Run, ...]


@attrs.frozen(slots=True)
class LocatedDeliver:
    """A durable Deliver whose runs are all located chunks
    (``broky.protocol.located``), left in the frame: ``runs`` uoffsets
    starting at ``runs_at`` in ``buffer``, ``count`` messages in all.

    Only ``ProtocolMachine.receive_deliveries`` hands these out (the
    client's reader), and only where the compiled chunk reader checked every
    chunk: a consumer then reads each run in place when the application
    takes it, with no ``Run`` built per run (one per message when keys
    change on every message). Never encoded: on the wire it is a Deliver.
    """

    stream: int
    buffer: Buffer = attrs.field(eq=False, repr=False)
    runs_at: int
    runs: int
    count: int


@attrs.frozen(slots=True)
class Flow:
    """Grant ``credit`` more messages to a subscription."""

    stream: int
    credit: int


@attrs.frozen(slots=True)
class Ping:
    """Liveness probe and flush barrier."""

    nonce: int


@attrs.frozen(slots=True)
class Pong:
    """Answer to Ping."""

    nonce: int


@attrs.frozen(slots=True)
class Error:
    """Stream error (stream != 0) or connection error (stream == 0)."""

    code: ErrorCode
    message: str
    stream: int = 0


@attrs.frozen(slots=True)
class Notice:
    """Non-error information about a stream (e.g. messages dropped)."""

    stream: int
    kind: NoticeKind
    count: int


@attrs.frozen(slots=True)
class PublishAck:
    """The durability point of one acked Publish frame was reached.

    ``sequence`` counts the connection's acked Publish frames from 1; acks come
    in that order. Entry i says that run ``runs[i]`` of the frame (or the part
    of it that went to ``partitions[i]``) got offsets ``first_offsets[i]`` to
    ``last_offsets[i]``. Ephemeral runs of the frame have no entry.

    Broker-internal (an owner worker answering a forwarded frame, whose runs
    belong to several clients): refusal i says that run ``refused_runs[i]``
    (or a part of it) was not stored, with ``refused_codes[i]`` and
    ``refused_reasons[i]``, so the forwarding worker fails that run's client
    only. Empty towards clients, whose frames are acked or refused whole.
    """

    stream: int
    sequence: int
    runs: tuple[int, ...] = ()
    partitions: tuple[int, ...] = ()
    first_offsets: tuple[int, ...] = ()
    last_offsets: tuple[int, ...] = ()
    refused_runs: tuple[int, ...] = ()
    refused_codes: tuple[ErrorCode, ...] = ()
    refused_reasons: tuple[str, ...] = ()


@attrs.frozen(slots=True)
class ListPartitions:
    """Ask for the partitions of the durable topics named ``topic`` ("" for all)."""

    stream: int
    topic: str = ""


@attrs.frozen(slots=True)
class Partitions:
    """Answer to ListPartitions: one entry per partition, as parallel tuples."""

    stream: int
    topics: tuple[str, ...] = ()
    partitions: tuple[int, ...] = ()
    start_offsets: tuple[int, ...] = ()
    end_offsets: tuple[int, ...] = ()


@attrs.frozen(slots=True)
class Fetch:
    """Read a durable partition from ``offset``, at most ``max_bytes`` of stored batches."""

    stream: int
    topic: str
    partition: int
    offset: int
    max_bytes: int = 0


@attrs.frozen(slots=True)
class Fetched:
    """Answer to Fetch: runs carrying their partition and base offset (none: at the end)."""

    stream: int
    runs: tuple[Run, ...]


@attrs.frozen(slots=True)
class Consume:
    """Attach a consumer to a durable subscription (see ``Consume`` in the schema)."""

    stream: int
    subscription: str
    pattern: bytes
    kind: SubscriptionKind = SubscriptionKind.SHARED
    start: StartKind = StartKind.LATEST
    credit: int = 1000
    max_in_flight: int = 1000
    ack_timeout_ms: int = 30_000
    max_deliveries: int = 10
    backoff_ms: tuple[int, ...] = ()
    priority: int = 0
    start_time: int = 0
    start_offsets: tuple[int, ...] = ()
    #: The ``[[durable]]`` topic for dead letters ("": the default).
    dead_letter_topic: str = ""
    #: ``AdoptSetting`` bits: settings left to an existing subscription.
    adopt_settings: int = 0


@attrs.frozen(slots=True)
class Redelivered:
    """Delivery counts (> 1) of the messages in the next Deliver of ``stream``,
    and the topic of every Deliver on ``stream`` until the next Redelivered."""

    stream: int
    partitions: tuple[int, ...] = ()
    offsets: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    topic: str = ""


@attrs.frozen(slots=True)
class Settle:
    """Ack, nack, term or in-progress for ranges of offsets, as parallel tuples."""

    stream: int
    sequence: int = 0
    kind: SettleKind = SettleKind.ACK
    partitions: tuple[int, ...] = ()
    first_offsets: tuple[int, ...] = ()
    last_offsets: tuple[int, ...] = ()
    delay_ms: int = -1
    reason: str = ""
    topic: str = ""


@attrs.frozen(slots=True)
class Settled:
    """Receipt of a Settle: its changes are committed."""

    stream: int
    sequence: int
    stale: int = 0
    #: Settled offsets whose owner went down before confirming them.
    unconfirmed: int = 0


@attrs.frozen(slots=True)
class DeleteSubscription:
    """Delete a durable subscription (see ``DeleteSubscription`` in the schema)."""

    stream: int
    subscription: str
    pattern: bytes = b""
    force: bool = False
    phase: DeletePhase = DeletePhase.WHOLE


@attrs.frozen(slots=True)
class DeletedSubscription:
    """The answer to ``DeleteSubscription``: the subscription is gone."""

    stream: int
    partitions: int = 0
    consumers: int = 0


Frame: TypeAlias = (
    Hello
    | Welcome
    | Publish
    | Subscribe
    | Subscribed
    | Unsubscribe
    | Deliver
    | Flow
    | Ping
    | Pong
    | Error
    | Notice
    | PublishAck
    | ListPartitions
    | Partitions
    | Fetch
    | Fetched
    | Consume
    | Redelivered
    | Settle
    | Settled
    | DeleteSubscription
    | DeletedSubscription
)
#: What a ProtocolMachine hands over: wire frames, and on a server that asks
#: for it, Publish frames to forward as they came (ForwardPublish), on a
#: client that asks for it, durable Delivers left in place (LocatedDeliver).
Received: TypeAlias = Frame | ForwardPublish | LocatedDeliver
