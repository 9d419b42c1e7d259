"""A follower that retention left behind restarts its log at the leader's log start.

Before this, a fetch below the leader's start failed its read, the leader
closed the link and the follower asked for the same offset forever.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from broky.cluster.epochs import EpochHistory
from broky.replication import epochfile
from broky.replication.faults import LinkSwitch
from broky.replication.follower import Follower
from broky.replication.gate import PartitionReplica
from broky.replication.wire import (
    Fetch,
    Fetched,
    Message,
    RefusalReason,
    Refused,
    ReplicatedRun,
)
from broky.storage.log import PartitionLog
from tests.storage.runs import make_run, read_all


@attrs.define
class _Topic:
    name: str = "orders"
    acks: str = "all"


class _Owner:
    """The part of a PartitionOwner a follower uses, over a real log."""

    def __init__(self, partition_log: PartitionLog) -> None:
        self.topic = _Topic()
        self.partition = 0
        self.log = partition_log
        self.start_offset = partition_log.start_offset
        self.end_offset = partition_log.end_offset

    async def call(self, request: Callable[[PartitionLog], Any]) -> Any:
        result = request(self.log)
        self.start_offset, self.end_offset = self.log.start_offset, self.log.end_offset
        return result


class _Done(Exception):
    pass


class _Leader:
    """Scripted answers: refuse below ``start``, then serve one run from it."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.asked: list[int] = []

    async def request(self, message: Message) -> Message:
        assert isinstance(message, Fetch)
        self.asked.append(message.offset)
        if message.offset < self.start:
            return Refused(RefusalReason.BEFORE_LOG_START, 4, "retention", self.start)
        if message.offset == self.start:
            run = make_run(b"orders.k", [b"x", b"y"])
            return Fetched(
                4,
                self.start + 2,
                (
                    ReplicatedRun(
                        4, self.start, 2, run.key, 7, bytes(run.sizes), bytes(run.messages)
                    ),
                ),
            )
        raise _Done


async def test_a_follower_below_the_leaders_log_start_restarts_there(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path)) as partition_log:
        partition_log.append([make_run(b"orders.k", [b"old%d" % i for i in range(5)])])
        partition_log.sync()
        owner = _Owner(partition_log)
        replica = PartitionReplica(owner, "n2", EpochHistory([(2, 0)]), 4)  # type: ignore[arg-type]
        follower = Follower(replica, "127.0.0.1:1", 4, 1, LinkSwitch())
        leader = _Leader(start=100)
        with pytest.raises(_Done):
            await follower._fetch(leader)  # type: ignore[arg-type]
        assert leader.asked == [5, 100, 102]
        assert (partition_log.start_offset, partition_log.end_offset) == (100, 102)
        assert read_all(partition_log) == [(100, b"orders.k", b"x"), (101, b"orders.k", b"y")]
        assert replica.history.entries == ((4, 100),)
        assert replica.high_watermark == 102
        saved, fence = epochfile.load(str(tmp_path))
        assert (saved.entries, fence) == (((4, 100),), 4)
