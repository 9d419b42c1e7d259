"""Durable topic policies: which keys are kept, in how many partitions, how.

A *durable topic* is a named policy with a key pattern (the subscription
pattern rules: ``*`` one token, a final ``>`` one or more, ``$SYS`` keys only
for ``$SYS`` patterns). Every key the pattern matches is stored in that
topic's partitions, under ``<data dir>/<topic name>/<partition>/``. Keys that
match no policy stay ephemeral, exactly as without storage. When several
policies match a key, the one declared first wins, so that a specific rule
can be listed before a catch-all.

Partitioning: a message goes to ``xxh3_64(key_partition) % partitions``;
a message without ``key_partition`` uses its run's key instead, so that one
key's messages stay in one partition and keep their order.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import xxhash

from broky.compiled import compiled_twin
from broky.protocol.codec import read_bytes, table_fields, u32_array
from broky.protocol.frames import Buffer, Run
from broky.router.matcher import SubscriptionIndex, validate_pattern
from broky.storage.config import LogConfig
from broky.storage.errors import StorageError

#: A topic name becomes a directory name: keep it portable and unambiguous.
TOPIC_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
#: Most partitions per topic: each is a directory with open files, and each
#: is owned by one router; thousands would only spread fsyncs thin.
MAX_PARTITIONS: Final = 1024
#: The values of a topic's ``acks`` (the first is the default).
ACKS_SETTINGS: Final = ("all", "leader")


def _topic_name(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not TOPIC_NAME.fullmatch(value) or value in (".", ".."):
        raise StorageError(f"topic name {value!r} must match {TOPIC_NAME.pattern}")


def _pattern(instance: object, attribute: attrs.Attribute[Any], value: bytes) -> None:
    validate_pattern(value)


def _partitions(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 1 <= value <= MAX_PARTITIONS:
        raise StorageError(f"partitions must be in [1, {MAX_PARTITIONS}], got {value}")


def _acks(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ACKS_SETTINGS:
        raise StorageError(f"acks must be one of {', '.join(ACKS_SETTINGS)}, got {value!r}")


@attrs.frozen(kw_only=True)
class TopicPolicy:
    """One durable topic: its name, the keys it keeps, its partitions and log settings."""

    name: str = attrs.field(validator=_topic_name)
    pattern: bytes = attrs.field(validator=_pattern)
    partitions: int = attrs.field(default=1, validator=_partitions)
    log: LogConfig = attrs.field(factory=LogConfig)
    #: When a replicated partition's leader acks a publish (broky.cluster.isr
    #: Acks): "all" at the high watermark, every ISR member having fsynced
    #: it (needs min_insync_replicas); "leader" at the leader's own fsync,
    #: which a leader failure can lose. Without replication, unused.
    acks: str = attrs.field(default="all", validator=_acks)


class TopicPolicies:
    """The configured policies with a cached matcher (the router's index)."""

    def __init__(self, policies: Sequence[TopicPolicy]) -> None:
        names = [policy.name for policy in policies]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise StorageError(f"durable topic names must be unique: {duplicates}")
        self.policies = tuple(policies)
        self._index: SubscriptionIndex[int] = SubscriptionIndex()
        for position, policy in enumerate(self.policies):
            self._index.add(policy.pattern, position)

    def named(self, name: str) -> TopicPolicy | None:
        """The policy called ``name``, if any."""
        for policy in self.policies:
            if policy.name == name:
                return policy
        return None

    def match(self, key: bytes) -> TopicPolicy | None:
        """The first-declared policy whose pattern matches ``key``, if any.

        Raises the protocol's InvalidKey error for an invalid key, as the
        router does.
        """
        found = self._index.match(key)
        return self.policies[min(found)] if found else None


def partition_for(partition_key: bytes, partitions: int) -> int:
    """The partition of a message with this ``key_partition`` (or run key)."""
    return xxhash.xxh3_64_intdigest(partition_key) % partitions


def key_partition(message: memoryview) -> bytes:
    """A message FlatBuffer's ``key_partition`` field (b"" when absent).

    Reads the field with four unpacks when every offset on the way is in
    bounds (the checks the validated table walk makes); any other message
    takes that walk, which says what is wrong with it. With a distinct
    ``key_partition`` per message this runs once per message.
    """
    size = len(message)
    try:
        table = _U32.unpack_from(message, 0)[0]
        if 0 <= table <= size - 4:
            vtable = table - _I32.unpack_from(message, table)[0]
            if 0 <= vtable <= size - 6:
                vtable_size, table_size, slot = _VTABLE_HEAD.unpack_from(message, vtable)
                if (
                    vtable_size >= 6
                    and not vtable_size & 1
                    and vtable + vtable_size <= size
                    and 4 <= slot < table_size
                    and table + table_size <= size
                ):
                    start = table + slot + _U32.unpack_from(message, table + slot)[0]
                    if start <= size - 4:
                        end = start + 4 + _U32.unpack_from(message, start)[0]
                        if end <= size:
                            return bytes(message[start + 4 : end])
    except struct.error:
        pass
    (field,) = table_fields(message, int.from_bytes(message[:4], "little"), 1)
    return read_bytes(message, field)


_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_I32: Final = struct.Struct("<i")
#: The head of a message as ``encode_message`` lays it out (root uoffset 20,
#: vtable at 4 whose first slot is key_partition, table soffset 16 at 20):
#: one read answers for the usual message.
_USUAL_HEAD: Final = struct.Struct("<IHHH10xi")
#: A vtable's size, its table's size and its first slot (key_partition).
_VTABLE_HEAD: Final = struct.Struct("<HHH")


def sticky_keys(key: bytes, sizes: Buffer, messages: Buffer) -> list[bytes]:
    """What each message of a run (``key``, its size table and messages)
    sticks to: its ``key_partition``, or the run's key when it has none (a
    key-shared subscription's slot follows it). One read per message
    without a ``key_partition`` (``has_key_partition``), not a table walk."""
    view = memoryview(messages)
    keys = []
    position = 0
    for size in u32_array(memoryview(sizes)):
        if has_key_partition(view, position):
            keys.append(key_partition(view[position : position + size]) or key)
        else:
            keys.append(key)
        position += size
    return keys


def has_key_partition(messages: Buffer, position: int) -> bool:
    """Whether the message at ``position`` may carry ``key_partition``: its
    vtable's first slot is set. One read for the usual layout, three for any
    other, instead of a validated table walk: most messages have no
    key_partition, and a message that has one (or whose header is garbage)
    takes the validated path."""
    try:
        if len(messages) - position >= _USUAL_HEAD.size:
            root, vtable_size, _, slot, soffset = _USUAL_HEAD.unpack_from(messages, position)
            if root == 20 and soffset == 16:
                return vtable_size > 4 and bool(slot)
        table = position + _U32.unpack_from(messages, position)[0]
        vtable: int = table - _I32.unpack_from(messages, table)[0]
        if vtable < 0 or _U16.unpack_from(messages, vtable)[0] <= 4:
            return vtable < 0
        return bool(_U16.unpack_from(messages, vtable + 4)[0])
    except struct.error:
        return True  # let the validated path say what is wrong


def partition_run(run: Run, partitions: int, default: int | None = None) -> list[tuple[int, Run]]:
    """Split a run into per-partition runs, keeping message order.

    Consecutive messages bound for one partition stay one run, so the usual
    case (one partition, or a run whose messages share a key_partition)
    returns the run itself. With one partition no message is looked at;
    otherwise each message's ``key_partition`` field is read (a vtable
    lookup, not a decode). The parts are views of the run's bytes.
    ``default`` is the partition of the run's key when the caller knows it
    (a cached ``partition_for``: the hash is then not computed again).
    """
    if partitions == 1:
        return [(0, run)]
    if default is None:
        default = partition_for(run.key, partitions)
    targets = message_partitions(run.messages, run.sizes, partitions, default)
    first = targets[0]
    if targets.count(first) == len(targets):
        return [(first, run)]
    return split_run(run, targets)


def split_run(run: Run, targets: Sequence[int]) -> list[tuple[int, Run]]:
    """``run`` cut where its messages' partitions (``targets``, one per
    message) change: each piece with its partition, in message order, as
    views of the run's bytes."""
    messages = memoryview(run.messages)
    sizes = u32_array(memoryview(run.sizes))
    size_table = memoryview(run.sizes)
    pieces: list[tuple[int, Run]] = []
    start = position = 0
    for index in range(1, len(targets) + 1):
        if index == len(targets) or targets[index] != targets[start]:
            length = sum(sizes[start:index])
            pieces.append(
                (
                    targets[start],
                    Run(
                        run.key,
                        run.ts_broker,
                        index - start,
                        size_table[4 * start : 4 * index],
                        messages[position : position + length],
                    ),
                )
            )
            start = index
            position += length
    return pieces


def message_partitions_pure(
    messages: Buffer, sizes: Buffer, partitions: int, default: int
) -> list[int]:
    """The partition of each message of a run (its ``messages`` and size
    table ``sizes``): its ``key_partition``'s, or ``default`` (the run key's)
    when it has none. One read per message without a ``key_partition``
    (``has_key_partition``), the field read when it has one.

    This is the pure-Python version; ``message_partitions`` is its compiled
    twin ``broky.storage._partitions`` where that is built (with a distinct
    ``key_partition`` per message this runs once per message).
    """
    view = memoryview(messages)
    targets = []
    position = 0
    for size in u32_array(memoryview(sizes)):
        if has_key_partition(view, position):
            partition_key = key_partition(view[position : position + size])
            targets.append(partition_for(partition_key, partitions) if partition_key else default)
        else:
            targets.append(default)
        position += size
    return targets


#: The compiled twin (``broky.storage._partitions``) when it is built.
message_partitions_compiled: Callable[[Buffer, Buffer, int, int], list[int]] | None = compiled_twin(
    "broky.storage._partitions", "message_partitions"
)
message_partitions = message_partitions_compiled or message_partitions_pure
