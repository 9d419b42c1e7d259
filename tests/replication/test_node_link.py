"""A follower link's thread call: the next fetch leaves after the appends,
the durable ends after the fsyncs; and the leader side takes those reports
while a fetch waits in its long poll."""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio
import trio.testing

from broky.replication.faults import LinkSwitch
from broky.replication.frames import FrameReader
from broky.replication.link import ReplicationLink
from broky.replication.node_link import _append_each
from broky.replication.serving import LinkServer
from broky.replication.wire import (
    Durable,
    DurableMany,
    Fetch,
    Fetched,
    FetchedMany,
    FetchMany,
    Message,
    Progress,
    ReplicatedRun,
)
from tests.replication.test_gate import _leading, _Outcomes, _run


class _Log:
    def __init__(self, end: int) -> None:
        self.end_offset = end
        self.durable_offset = end


class _Owner:
    def refresh(self, partition_log: Any) -> None:
        pass


class _Member:
    """A LinkMember that records what the thread call does, in order."""

    def __init__(self, partition: int, events: list[object], fail_sync: bool = False) -> None:
        self.key = ("orders", partition)
        self.owner = _Owner()
        self.stopped = False
        self.events = events
        self.fail_sync = fail_sync

    def fetch_request(self) -> Fetch:
        raise AssertionError("built on the trio side, before the call")

    def append(self, runs: tuple[ReplicatedRun, ...], partition_log: _Log) -> None:
        partition_log.end_offset += sum(run.count for run in runs)
        self.events.append(("append", self.key[1]))

    def sync(self, partition_log: _Log) -> int:
        self.events.append(("sync", self.key[1]))
        if self.fail_sync:
            raise OSError("fsync failed")
        partition_log.durable_offset = partition_log.end_offset
        return partition_log.durable_offset


def _call(
    batch: list[tuple[_Member, tuple[ReplicatedRun, ...]]], logs: list[_Log], next_fetch: Any
) -> dict[tuple[str, int], object]:
    """``_append_each`` over the fakes."""
    return dict(_append_each(cast(Any, batch), cast(Any, logs), next_fetch))


def _runs(base: int, count: int) -> tuple[ReplicatedRun, ...]:
    return (ReplicatedRun(3, base, count, b"k", 7, b"\0\0\0\0" * count, b""),)


def _fetch(partition: int, end: int) -> Fetch:
    return Fetch("orders", partition, 3, "n2", 2, end, end)


def test_the_next_fetch_leaves_after_the_appends_and_the_durable_ends_after_the_fsyncs() -> None:
    events: list[object] = []
    members = [_Member(0, events), _Member(1, events)]
    logs = [_Log(10), _Log(20)]
    # Partition 2 follows on the link too, with nothing in this answer.
    fetches = (_fetch(1, 20), _fetch(2, 5), _fetch(0, 10))
    failed = _call(
        [(members[0], _runs(10, 3)), (members[1], _runs(20, 1))],
        logs,
        (fetches, events.append),
    )
    assert failed == {}
    assert events == [
        ("append", 0),
        ("append", 1),
        # From the new ends, reporting the durable ends before the appends.
        FetchMany(
            (
                Fetch("orders", 1, 3, "n2", 2, 21, 20),
                _fetch(2, 5),
                Fetch("orders", 0, 3, "n2", 2, 13, 10),
            )
        ),
        ("sync", 0),
        ("sync", 1),
        DurableMany((Durable("orders", 1, 3, "n2", 2, 21), Durable("orders", 0, 3, "n2", 2, 13))),
    ]


def test_a_failed_fsync_is_not_reported_and_a_failed_send_is_raised_after_the_fsyncs() -> None:
    events: list[object] = []
    members = [_Member(0, events, fail_sync=True), _Member(1, events)]
    failed = _call(
        [(members[0], _runs(10, 3)), (members[1], _runs(20, 1))],
        [_Log(10), _Log(20)],
        ((_fetch(0, 10), _fetch(1, 20)), events.append),
    )
    assert list(failed) == [("orders", 0)]
    assert events[-1] == DurableMany((Durable("orders", 1, 3, "n2", 2, 21),))

    def broken(message: Message) -> None:
        events.append(type(message).__name__)
        raise BrokenPipeError("the leader went away")

    events.clear()
    with pytest.raises(BrokenPipeError):
        _call(
            [(_Member(0, events), _runs(10, 3))],
            [_Log(10)],
            ((_fetch(0, 10),), broken),
        )
    assert events == [("append", 0), "FetchMany", ("sync", 0)]


async def test_a_thread_sends_whole_frames_on_the_links_socket() -> None:
    left, right = trio.socket.socketpair()
    stream = trio.SocketStream(left)
    send = ReplicationLink(stream).thread_sender()
    assert send is not None
    # More than the socket buffer holds: the thread waits for room.
    fetches = FetchMany(tuple(_fetch(p, 2**40) for p in range(20_000)))
    reader, received = FrameReader(), list[Message]()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, send, fetches)
        while not received:
            received.extend(reader.feed(await right.recv(1 << 20)))
    assert received == [fetches]
    await stream.aclose()
    right.close()
    assert ReplicationLink(trio.testing.memory_stream_pair()[0]).thread_sender() is None


async def test_a_durable_report_is_taken_while_the_fetch_waits_in_its_long_poll() -> None:
    replica, owner = _leading()
    outcomes = _Outcomes()
    server = LinkServer({("orders", 0): replica}, LinkSwitch(), lambda: Progress("n1", 1, ()))
    follower_end, leader_end = trio.testing.memory_stream_pair()
    follower = ReplicationLink(follower_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_link, ReplicationLink(leader_end))
        owner.end_offset = 4
        replica.hold(0, [_run(4)], [7], outcomes.deliver, outcomes.fail)
        answer: Message | None = await follower.request(FetchMany((_fetch(0, 0),)))
        assert isinstance(answer, FetchedMany)
        assert isinstance(answer.answers[0], Fetched)
        assert [run.count for run in answer.answers[0].runs] == [4]
        # The next fetch leaves before the fsync, and waits in a long poll.
        await follower.send(FetchMany((Fetch("orders", 0, 3, "n2", 2, 4, 0),)))
        await trio.testing.wait_all_tasks_blocked()
        await follower.send(DurableMany((Durable("orders", 0, 2, "n2", 2, 4),)))  # stale
        await trio.testing.wait_all_tasks_blocked()
        assert (outcomes.delivered, replica.high_watermark) == (0, 0)
        await follower.send(DurableMany((Durable("orders", 0, 3, "n2", 2, 4),)))
        await trio.testing.wait_all_tasks_blocked()
        assert (outcomes.delivered, replica.high_watermark) == (1, 4)
        # The long poll answers with the watermark once the linger is over.
        answer = await follower.receive()
        assert isinstance(answer, FetchedMany)
        assert isinstance(answer.answers[0], Fetched)
        assert (answer.answers[0].runs, answer.answers[0].high_watermark) == ((), 4)
        await follower_end.aclose()  # the server's side ends with the peer
