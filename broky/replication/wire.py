"""The replication protocol between nodes: its messages, and the JSON
headers of the rare ones.

broky.replication.frames frames them (bytes in, messages out, no I/O):
``Fetch`` and ``Fetched``, a pair per partition and round, with binary
headers (broky.replication.fetch_codec), the others with JSON headers from
here, readable in a packet capture. A Fetched carries the raw bytes of its
runs (size tables and messages, copied from the leader's log unchanged):
the bytes that matter are never re-encoded.

Messages, by direction:

- follower -> leader: ``FetchMany``, a ``Fetch`` per partition the
  follower follows from that leader node (from my log end; my durable
  offset, which doubles as my ack; the subscription state I have stored),
  answered by ``FetchedMany``, a ``Fetched`` or ``Refused`` per partition
  in the same order; ``EpochEnd``
  (where does my latest epoch end in your log? KIP-101's
  OffsetsForLeaderEpoch);
- leader -> follower: ``Fetched`` (runs, each with the epoch it was written
  in, the high watermark, and the subscription state the follower lacks:
  broky.subscriptions.journal), ``EpochEnded``, ``Refused`` (a typed reason);
- operator -> any member: ``ProgressRequest``, answered by ``Progress`` (each
  partition's role, epoch, log end, high watermark and, on its leader, the
  followers' lag), for ``broky cluster status``.

Malformed input raises ``ReplicationProtocolError``; the caller closes that
connection and logs it, nothing else.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from typing import Any, Final

import attrs

from broky.protocol.frames import Buffer

#: Bytes of runs one Fetched carries at most (the leader stops adding runs
#: past it): large enough that a catching-up follower moves ~1 MiB per round
#: trip, small enough to bound each follower's in-flight memory.
FETCH_MAX_BYTES: Final = 1024 * 1024


class ReplicationProtocolError(Exception):
    """The peer sent something that is not a replication frame."""


class RefusalReason(enum.Enum):
    #: The receiver does not lead this partition (per its etcd view).
    NOT_LEADER = "not_leader"
    #: The requester's epoch is older than the receiver's: it must re-read
    #: etcd and truncate before fetching again.
    STALE_EPOCH = "stale_epoch"
    #: The requester follows a newer epoch: the receiver was deposed.
    FENCED = "fenced"
    #: The fetch offset is past the leader's log end: truncate first.
    OUT_OF_RANGE = "out_of_range"
    #: The fetch offset is below the leader's log start (retention deleted
    #: it): the follower restarts its log at ``Refused.log_start``.
    BEFORE_LOG_START = "before_log_start"


@attrs.frozen
class Fetch:
    topic: str
    partition: int
    #: The leader epoch the follower follows.
    epoch: int
    node: str
    node_epoch: int
    #: The follower's log end: where to read from.
    offset: int
    #: Everything below this the follower has fsynced: its ack.
    durable: int
    #: The subscription state the follower has stored: the leadership
    #: (epoch) and the version within it (-1: none yet; StateJournal).
    state_epoch: int = -1
    state_version: int = -1


@attrs.frozen
class EpochEnd:
    topic: str
    partition: int
    epoch: int
    #: The follower's latest epoch in its own history (-1: an empty history).
    last_epoch: int


@attrs.frozen
class ReplicatedRun:
    """One run of the leader's log: its offsets, key, stamp and the epoch it
    was written in; ``sizes`` and ``messages`` as stored; the idempotent
    producer that published it and the sequence of its first message (0, 0:
    none), which the follower stores with it: a follower that takes the lead
    rebuilds its deduplication window from them (broky.durable.producers), so
    a retry of a publish the deposed leader stored is not stored again.

    A follower's decoded runs hold ``sizes`` and ``messages`` as views of
    the answer's frame (broky.replication.fetch_codec), not copies: the log
    append copies them into its batch anyway, so a copy per run here only
    cost CPU on every follower round."""

    epoch: int
    base_offset: int
    count: int
    key: bytes
    ts_broker: int
    sizes: Buffer
    messages: Buffer
    producer: int = 0
    sequence: int = 0


@attrs.frozen
class StateEntry:
    """One durable subscription's state in the partition, as its leader
    committed it: the definition (JSON) and image (broky.subscriptions.image);
    both empty for a subscription the leader deleted (a tombstone)."""

    version: int
    subscription: str
    definition: str
    image: bytes

    @property
    def deleted(self) -> bool:
        return not self.definition


@attrs.frozen
class StateUpdate:
    """Subscription state for a follower: store ``entries`` (and, on a
    resync, drop every subscription not in ``names``), then report
    ``(epoch, version)`` in the next Fetch."""

    epoch: int
    version: int
    names: tuple[str, ...] | None
    entries: tuple[StateEntry, ...]


@attrs.frozen
class Fetched:
    epoch: int
    high_watermark: int
    runs: tuple[ReplicatedRun, ...]
    state: StateUpdate | None = None


@attrs.frozen
class FetchMany:
    """A follower's fetches of every partition it follows from one leader
    node, in one round trip (broky.replication.node_link)."""

    fetches: tuple[Fetch, ...]


@attrs.frozen
class FetchedMany:
    """The answers to a FetchMany, in its order: for each partition its
    Fetched, or the Refused that concerns that partition alone."""

    answers: tuple[Fetched | Refused, ...]


@attrs.frozen
class EpochEnded:
    epoch: int
    #: ``(largest epoch <= asked, where it ends in the leader's log)``, or
    #: None when every epoch of the leader is newer (truncate everything).
    found: tuple[int, int] | None


@attrs.frozen
class Refused:
    reason: RefusalReason
    #: The refuser's epoch for the partition (0 if it has none).
    epoch: int
    message: str = ""
    #: For BEFORE_LOG_START: the leader's oldest offset (0 otherwise).
    log_start: int = 0


@attrs.frozen
class ProgressRequest:
    """What are your partitions' offsets? (no fields)"""


@attrs.frozen
class PartitionProgress:
    """One partition on the answering node."""

    topic: str
    partition: int
    #: "leader", "follower" or "none".
    role: str
    epoch: int
    log_end: int
    high_watermark: int
    #: On the leader: (follower, messages behind the leader's log end).
    follower_lag: tuple[tuple[str, int], ...] = ()


@attrs.frozen
class Progress:
    node: str
    #: The answering node's life (0 between lives).
    node_epoch: int
    partitions: tuple[PartitionProgress, ...]


Message = (
    Fetch
    | FetchMany
    | EpochEnd
    | Fetched
    | FetchedMany
    | EpochEnded
    | Refused
    | ProgressRequest
    | Progress
)


def json_header(message: Message) -> bytes:
    """The JSON header of any message but Fetch and Fetched (which
    broky.replication.fetch_codec encodes), none of which has a payload."""
    header: dict[str, Any]
    if isinstance(message, Fetch | Fetched | FetchMany | FetchedMany):
        raise TypeError(f"{type(message).__name__} has a binary header")
    if isinstance(message, Refused):
        header = {
            "t": "refused",
            "reason": message.reason.value,
            "epoch": message.epoch,
            "message": message.message,
            "start": message.log_start,
        }
    elif isinstance(message, EpochEnded):
        header = {"t": "epoch_ended", "epoch": message.epoch, "found": message.found}
    elif isinstance(message, Progress):
        header = {
            "t": "progress",
            "node": message.node,
            "node_epoch": message.node_epoch,
            "partitions": [
                [p.topic, p.partition, p.role, p.epoch, p.log_end, p.high_watermark]
                + [list(lag) for lag in p.follower_lag]
                for p in message.partitions
            ],
        }
    else:
        header = {"t": type(message).__name__.lower(), **attrs.asdict(message)}
    return json.dumps(header, separators=(",", ":")).encode()


def state_header(update: StateUpdate) -> dict[str, Any]:
    """``update`` as JSON-ready data (a Fetched carries it as JSON: it is rare)."""
    return {
        "epoch": update.epoch,
        "version": update.version,
        "names": None if update.names is None else list(update.names),
        "entries": [
            [e.version, e.subscription, e.definition, base64.b64encode(e.image).decode()]
            for e in update.entries
        ],
    }


def state_from(header: object) -> StateUpdate | None:
    """The StateUpdate of ``state_header``'s data; ReplicationProtocolError
    (or KeyError, TypeError, ValueError) for any other shape."""
    if header is None:
        return None
    if not isinstance(header, dict):
        raise ReplicationProtocolError("subscription state is not an object")
    names = header["names"]
    if names is not None and not isinstance(names, list):
        raise ReplicationProtocolError("subscription names are not a list")
    entries = []
    for entry in header["entries"]:
        if not isinstance(entry, list) or len(entry) != 4:
            raise ReplicationProtocolError(f"not a state entry: {entry!r:.60}")
        try:
            image = base64.b64decode(_str(entry[3]), validate=True)
        except binascii.Error as exc:
            raise ReplicationProtocolError(f"a state image is not base64: {exc}") from exc
        entries.append(StateEntry(_int(entry[0]), _str(entry[1]), _str(entry[2]), image))
    return StateUpdate(
        _int(header["epoch"]),
        _int(header["version"]),
        None if names is None else tuple(_str(name) for name in names),
        tuple(entries),
    )


def _int(value: object) -> int:
    if type(value) is not int:
        raise ReplicationProtocolError(f"expected an integer, got {value!r:.40}")
    return value


def _str(value: object) -> str:
    if type(value) is not str:
        raise ReplicationProtocolError(f"expected a string, got {value!r:.40}")
    return value


def decode_json(data: bytes) -> Message:
    """The message of a JSON header; ReplicationProtocolError for anything else."""
    try:
        header = json.loads(data)
        if not isinstance(header, dict):
            raise TypeError("header is not an object")
        return _decode(header)
    except ReplicationProtocolError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise ReplicationProtocolError(f"malformed replication frame: {exc}") from exc


def _decode(header: dict[str, Any]) -> Message:
    kind = header.pop("t")
    if kind == "epochend":
        return EpochEnd(
            _str(header["topic"]),
            _int(header["partition"]),
            _int(header["epoch"]),
            _int(header["last_epoch"]),
        )
    if kind == "epoch_ended":
        found = header["found"]
        return EpochEnded(
            _int(header["epoch"]), None if found is None else (_int(found[0]), _int(found[1]))
        )
    if kind == "refused":
        return Refused(
            RefusalReason(header["reason"]),
            _int(header["epoch"]),
            _str(header["message"]),
            _int(header.get("start", 0)),
        )
    if kind in ("progressrequest", "progress"):
        return _decode_progress(kind, header)
    raise ReplicationProtocolError(f"unknown message type {kind!r}")


def _decode_progress(kind: str, header: dict[str, Any]) -> ProgressRequest | Progress:
    if kind == "progressrequest":
        return ProgressRequest()
    return Progress(
        _str(header["node"]),
        _int(header["node_epoch"]),
        tuple(_partition_progress(entry) for entry in header["partitions"]),
    )


def _partition_progress(entry: object) -> PartitionProgress:
    if not isinstance(entry, list) or len(entry) < 6:
        raise ReplicationProtocolError(f"not a partition entry: {entry!r:.60}")
    topic, partition, role, epoch, log_end, high_watermark, *lags = entry
    follower_lag = []
    for lag in lags:
        if not isinstance(lag, list) or len(lag) != 2:
            raise ReplicationProtocolError(f"not a follower lag: {lag!r:.60}")
        follower_lag.append((_str(lag[0]), _int(lag[1])))
    return PartitionProgress(
        _str(topic),
        _int(partition),
        _str(role),
        _int(epoch),
        _int(log_end),
        _int(high_watermark),
        tuple(follower_lag),
    )
