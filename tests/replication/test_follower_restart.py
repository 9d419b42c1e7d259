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
import trio
import trio.testing

from broky.cluster.epochs import EpochHistory
from broky.replication import epochfile
from broky.replication.faults import LinkSwitch
from broky.replication.follower import Follower
from broky.replication.frames import FrameReader
from broky.replication.gate import PartitionReplica
from broky.replication.node_link import NodeLink, NodeLinks
from broky.replication.wire import (
    Fetch,
    Fetched,
    FetchedMany,
    FetchMany,
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
        self.refresh(self.log)
        return result

    async def borrow(self) -> PartitionLog:
        return self.log

    def give_back(self) -> None:
        pass

    def refresh(self, partition_log: PartitionLog) -> None:
        self.start_offset, self.end_offset = partition_log.start_offset, partition_log.end_offset


class _Done(Exception):
    pass


class _Leader:
    """Scripted answers: refuse below ``start``, then serve one run from it."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.asked: list[int] = []

    async def request_frame(self, frame: bytes) -> Message:
        (message,) = FrameReader().feed(frame)
        assert isinstance(message, FetchMany)
        (fetch,) = message.fetches
        return FetchedMany((self._answer(fetch),))

    def _answer(self, message: Fetch) -> Fetched | Refused:
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
        switch = LinkSwitch()
        follower = Follower(replica, "127.0.0.1:1", 4, 1, switch, NodeLinks(switch))
        node_link = NodeLink("127.0.0.1:1", switch)
        leader = _Leader(start=100)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node_link.follow, follower)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(_Done):
                await node_link.rounds(leader)  # type: ignore[arg-type]
            nursery.cancel_scope.cancel()
        assert leader.asked == [5, 100, 102]
        assert (partition_log.start_offset, partition_log.end_offset) == (100, 102)
        assert read_all(partition_log) == [(100, b"orders.k", b"x"), (101, b"orders.k", b"y")]
        assert replica.history.entries == ((4, 100),)
        assert replica.high_watermark == 102
        saved, fence = epochfile.load(str(tmp_path))
        assert (saved.entries, fence) == (((4, 100),), 4)
