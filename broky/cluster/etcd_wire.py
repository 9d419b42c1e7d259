"""etcd v3's JSON gateway, as data: requests built and answers parsed, no I/O.

The gateway (``POST /v3/kv/range`` and friends) is etcd's gRPC API rendered
as JSON by grpc-gateway, which shapes every detail here: keys and values are
base64; int64 fields (revisions, lease IDs, TTLs) travel as JSON *strings*;
fields holding their type's zero value are left out, so a missing
``succeeded`` means False, a missing event ``type`` means PUT, and a
keepalive answer without ``TTL`` means the lease has expired. Errors come
back as ``{"error", "code"}`` with a gRPC status code.

Only what Broky's cluster needs is modelled: range, put, delete, txn with
compares on value / create / mod revision, leases and watches.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

#: JSON as the gateway sends it (nested dicts, lists, strings).
Json = dict[str, Any]


class EtcdError(Exception):
    """etcd refused a request or answered something this client cannot read.

    ``code`` is the gRPC status code etcd sent (0 when the answer itself was
    malformed); the message is etcd's own."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class WatchCompacted(EtcdError):
    """A watch asked for revisions etcd has compacted away: the watcher must
    re-read the whole range and watch from the revision of that read."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"etcd compacted history up to revision {compact_revision}")
        self.compact_revision = compact_revision


def b64(data: bytes) -> str:
    """Bytes as the gateway wants them."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    """Bytes from the gateway's base64 (the empty string when absent)."""
    return base64.b64decode(text)


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with
    ``prefix`` (etcd's rule: the prefix with its last byte below 0xff + 1)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\x00"  # every key
    return stripped[:-1] + bytes([stripped[-1] + 1])


@attrs.frozen
class KeyValue:
    """One key as etcd stores it: ``create_revision`` is the revision that
    created this incarnation of the key (a fencing token when the key is an
    election), ``mod_revision`` the last change (the token for compare-and-swap)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: Mapping[str, Any]) -> KeyValue:
        return cls(
            key=unb64(kv.get("key", "")),
            value=unb64(kv.get("value", "")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            version=int(kv.get("version", 0)),
            lease=int(kv.get("lease", 0)),
        )


class Target(enum.Enum):
    """What a compare looks at, with the JSON field holding the operand."""

    VALUE = ("VALUE", "value")
    CREATE = ("CREATE", "create_revision")
    MOD = ("MOD", "mod_revision")
    VERSION = ("VERSION", "version")


@attrs.frozen
class Compare:
    """A txn guard: ``key``'s target equals ``operand``. A missing key has
    create / mod revision and version 0, so ``Compare.created(key, 0)`` means
    "absent"."""

    key: bytes
    target: Target
    operand: int | bytes

    @classmethod
    def value(cls, key: bytes, value: bytes) -> Compare:
        return cls(key, Target.VALUE, value)

    @classmethod
    def created(cls, key: bytes, revision: int) -> Compare:
        return cls(key, Target.CREATE, revision)

    @classmethod
    def modified(cls, key: bytes, revision: int) -> Compare:
        return cls(key, Target.MOD, revision)

    def to_json(self) -> Json:
        name, field = self.target.value
        operand = b64(self.operand) if isinstance(self.operand, bytes) else str(self.operand)
        return {"key": b64(self.key), "target": name, "result": "EQUAL", field: operand}


@attrs.frozen
class Put:
    """Set ``key`` to ``value``, attached to ``lease`` (0: none) when given."""

    key: bytes
    value: bytes
    lease: int = 0

    def to_json(self) -> Json:
        body: Json = {"key": b64(self.key), "value": b64(self.value)}
        if self.lease:
            body["lease"] = str(self.lease)
        return body


@attrs.frozen
class Get:
    """Read ``key``, or every key from ``key`` up to ``range_end`` (excluded)."""

    key: bytes
    range_end: bytes = b""

    @classmethod
    def prefix(cls, prefix: bytes) -> Get:
        return cls(prefix, prefix_end(prefix))

    def to_json(self) -> Json:
        body: Json = {"key": b64(self.key)}
        if self.range_end:
            body["range_end"] = b64(self.range_end)
        return body


@attrs.frozen
class Delete:
    """Delete ``key``, or the range up to ``range_end``."""

    key: bytes
    range_end: bytes = b""

    def to_json(self) -> Json:
        return Get(self.key, self.range_end).to_json()


Operation = Put | Get | Delete


def operation_json(operation: Operation) -> Json:
    """One member of a txn's ``success`` or ``failure`` list."""
    if isinstance(operation, Put):
        return {"request_put": operation.to_json()}
    if isinstance(operation, Get):
        return {"request_range": operation.to_json()}
    return {"request_delete_range": operation.to_json()}


def txn_json(
    compare: Sequence[Compare], success: Sequence[Operation], failure: Sequence[Operation]
) -> Json:
    """The body of ``POST /v3/kv/txn``."""
    return {
        "compare": [item.to_json() for item in compare],
        "success": [operation_json(item) for item in success],
        "failure": [operation_json(item) for item in failure],
    }


@attrs.frozen
class RangeResult:
    """A read: the keys found and the store's revision when it was read
    (watch from ``revision + 1`` to miss nothing after it)."""

    revision: int
    kvs: tuple[KeyValue, ...]


@attrs.frozen
class TxnResult:
    """A transaction's outcome: which branch ran, at which revision, and what
    each ``Get`` of that branch read (in order; puts and deletes omitted)."""

    succeeded: bool
    revision: int
    ranges: tuple[tuple[KeyValue, ...], ...]


def header_revision(answer: Mapping[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))


def parse_range(answer: Mapping[str, Any]) -> RangeResult:
    kvs = tuple(KeyValue.from_json(kv) for kv in answer.get("kvs", ()))
    return RangeResult(header_revision(answer), kvs)


def parse_txn(answer: Mapping[str, Any]) -> TxnResult:
    ranges = tuple(
        tuple(KeyValue.from_json(kv) for kv in response["response_range"].get("kvs", ()))
        for response in answer.get("responses", ())
        if "response_range" in response
    )
    return TxnResult(bool(answer.get("succeeded", False)), header_revision(answer), ranges)


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@attrs.frozen
class Event:
    """One change seen by a watch; a DELETE's ``kv`` carries only the key and
    the deleting revision (its ``mod_revision``)."""

    type: EventType
    kv: KeyValue


@attrs.frozen
class WatchBatch:
    """One line of a watch stream: the events of one or more revisions, or a
    bare header (the "created" notice and progress notifications)."""

    revision: int
    events: tuple[Event, ...]


def watch_create_json(key: bytes, range_end: bytes, start_revision: int) -> Json:
    """The body of ``POST /v3/watch`` opening one watch."""
    request: Json = {"key": b64(key), "start_revision": str(start_revision)}
    if range_end:
        request["range_end"] = b64(range_end)
    return {"create_request": request}


def parse_watch_line(line: str) -> WatchBatch:
    """One newline-delimited answer of a watch stream.

    Raises WatchCompacted when the start revision is gone, EtcdError when
    etcd cancelled the watch or sent an error."""
    answer = check(decode(line))
    result = answer.get("result", {})
    compact_revision = int(result.get("compact_revision", 0))
    if compact_revision:
        raise WatchCompacted(compact_revision)
    if result.get("canceled"):
        raise EtcdError(f"etcd cancelled the watch: {result.get('cancel_reason', '')}")
    events = tuple(
        Event(EventType(event.get("type", "PUT")), KeyValue.from_json(event.get("kv", {})))
        for event in result.get("events", ())
    )
    return WatchBatch(header_revision(result), events)


def decode(text: str | bytes) -> Json:
    """A gateway answer as JSON; EtcdError if it is not a JSON object."""
    try:
        answer = json.loads(text)
    except ValueError as exc:
        raise EtcdError(f"etcd answered something that is not JSON: {text[:200]!r}") from exc
    if not isinstance(answer, dict):
        raise EtcdError(f"etcd answered a JSON {type(answer).__name__}, not an object")
    return answer


def check(answer: Json) -> Json:
    """``answer`` unless it is an error (top level or inside a watch's ``error``)."""
    error = answer.get("error")
    if error is not None:
        if isinstance(error, dict):  # watch streams wrap errors one level deeper
            raise EtcdError(str(error.get("message", error)), int(error.get("grpc_code", 0)))
        raise EtcdError(str(answer.get("message", error)), int(answer.get("code", 0)))
    return answer
