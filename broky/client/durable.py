"""Client-side values of durable topics: start positions, acks, partitions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import attrs

from broky.protocol.constants import StartKind


@attrs.frozen
class Start:
    """Where a subscription starts reading the durable topics its pattern matches.

    Ephemeral keys are always live. After the backlog a subscription
    continues live with no gap and no duplicate.
    """

    kind: StartKind = StartKind.LATEST
    time_ns: int = 0
    offsets: tuple[int, ...] = ()

    @classmethod
    def latest(cls) -> Start:
        """Only what is appended from now on (the default)."""
        return cls()

    @classmethod
    def earliest(cls) -> Start:
        """Everything each partition still holds."""
        return cls(StartKind.EARLIEST)

    @classmethod
    def offset(cls, offsets: Mapping[int, int]) -> Start:
        """From ``offsets[partition]``; partitions not given start at the earliest."""
        table = [0] * (max(offsets, default=-1) + 1)
        for partition, offset in offsets.items():
            table[partition] = offset
        return cls(StartKind.OFFSET, offsets=tuple(table))

    @classmethod
    def time(cls, time_ns: int) -> Start:
        """From the first message appended at or after ``time_ns`` (ns since the epoch)."""
        return cls(StartKind.TIME, time_ns=time_ns)

    @classmethod
    def last(cls) -> Start:
        """The last message of each key, then live: what a late joiner needs."""
        return cls(StartKind.LAST)


class AckedRun(NamedTuple):
    """Offsets given to consecutive messages published with ``ack=True`` on ``key``."""

    key: str
    partition: int
    first_offset: int
    last_offset: int


class PartitionInfo(NamedTuple):
    """One durable partition and the offsets it holds (``end_offset`` is the next one)."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int


class SubscriptionDeletion(NamedTuple):
    """What ``Client.delete_subscription`` deleted, summed over the owner workers."""

    #: Partition state stores the subscription was removed from.
    partitions: int
    #: Consumers a forced deletion ended.
    consumers: int
