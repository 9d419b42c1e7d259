"""One replication link per node pair: a follower node's fetches of every
partition it follows from one leader node, one request per round.

A connection and a fetch loop per followed partition cost, per partition
and round, a request and an answer over loopback, a long poll on the
leader and a thread hand-off and an fsync call on the follower; on the
2-core machine the benchmarks run on, those per-round costs, not the
messages, bound replicated throughput (docs/cluster.md). A ``NodeLink``
carries them all: one ``FetchMany`` with a Fetch per partition, one
``FetchedMany`` back (broky.replication.gate ``fetch_all``, one long poll
for them all), and one thread call that appends and fsyncs every run the
answer brought, each partition's owner lending its log for it
(``PartitionOwner.borrow``).

What stays per partition: its leader epoch and truncation (each
``Follower`` truncates on a connection of its own before it joins,
broky.replication.follower); its refusals (a fenced, stale or refused
partition leaves the link and starts over, the others go on); its high
watermark, ack and subscription state. A link failure (a timeout, the peer
closing, garbage, a cut by broky.replication.faults) ends the link and
every partition on it starts over: that node pair only.

A partition joining while the link's long poll is out is first fetched
when that answer comes (at once under load, FETCH_WAIT at most when idle).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import partial
from typing import Protocol

import trio

from broky.durable.owner import PartitionOwner
from broky.durable.thread_hop import run_in_thread
from broky.replication.faults import LinkSwitch
from broky.replication.frames import encode_fetch_many
from broky.replication.link import ReplicationLink, open_stream
from broky.replication.wire import (
    Fetched,
    FetchedMany,
    Refused,
    ReplicatedRun,
    ReplicationProtocolError,
)
from broky.storage.errors import StorageError
from broky.storage.log import PartitionLog

log = logging.getLogger("broky.replication")

#: Seconds to wait for a leader's answer (a long poll takes FETCH_WAIT):
#: a paused or partitioned leader is given up on quickly, and its
#: followers reconnect (the etcd view decides whom they follow).
REQUEST_TIMEOUT = 2.0
#: Seconds a link with no partition left stays open for one to join (the
#: partitions of a failover rejoin one by one as each has truncated).
IDLE_CLOSE = 1.0

#: What ends a link for all its partitions.
LINK_ERRORS = (
    trio.TooSlowError,
    OSError,
    trio.BrokenResourceError,
    ReplicationProtocolError,
)


class Retry(Exception):
    """Start the partition over: reconnect, truncate if needed, rejoin (a
    refusal, a stale answer, the link cut)."""


class LinkMember(Protocol):
    """One followed partition on a link (broky.replication.follower's
    ``Follower``)."""

    @property
    def key(self) -> tuple[str, int]:
        """The partition: (topic, partition)."""

    @property
    def owner(self) -> PartitionOwner: ...

    #: Whether its role ended: ``append`` then appends nothing.
    stopped: bool

    def fetch_frame(self) -> bytes:
        """The partition's next Fetch, framed (its durable end is its ack)."""

    async def take(self, answer: Fetched | Refused) -> Fetched | None:
        """Judge the partition's answer: the Fetched to apply, None for
        nothing to apply this round; raises Retry or StorageError to leave."""

    def append(self, runs: tuple[ReplicatedRun, ...], partition_log: PartitionLog) -> None:
        """In the joint thread call, with the log lent: append and fsync."""

    async def finish(self, answer: Fetched) -> None:
        """After the append: store subscription state, take the watermark."""


class _Member:
    __slots__ = ("ended", "error", "follower")

    def __init__(self, follower: LinkMember) -> None:
        self.follower = follower
        self.ended = trio.Event()
        self.error: Exception = Retry("the link closed")

    def end(self, error: Exception) -> None:
        if not self.ended.is_set():
            self.error = error
            self.ended.set()


class NodeLink:
    """The link to the leader node (one of its workers) at ``address``."""

    def __init__(self, address: str, switch: LinkSwitch) -> None:
        self.address = address
        self.switch = switch
        self.members: dict[tuple[str, int], _Member] = {}
        #: Set once the link ends: a partition joins a new one then.
        self.closed = False
        self._joined = trio.Event()
        self._rotation = 0

    async def follow(self, follower: LinkMember) -> None:
        """Fetch for ``follower`` until that ends: raises what ended it."""
        key = follower.key
        member = _Member(follower)
        replaced = self.members.get(key)
        if replaced is not None:
            replaced.end(Retry("another follower of the partition joined"))
        self.members[key] = member
        self._joined.set()
        try:
            await member.ended.wait()
        finally:
            if self.members.get(key) is member:
                del self.members[key]
        raise member.error

    async def run(self) -> None:
        """Connect and fetch rounds until the link fails or stays idle."""
        error: Exception = Retry("the link closed")
        try:
            async with await open_stream(self.address) as stream:
                with self.switch.link():
                    await self.rounds(ReplicationLink(stream))
                if self.switch.cut:
                    error = Retry("replication links cut")
        except LINK_ERRORS as exc:
            log.info("link to %s lost: %r", self.address, exc)
            error = exc
        finally:
            self.closed = True
            for member in list(self.members.values()):
                member.end(error)

    async def rounds(self, link: ReplicationLink) -> None:
        """Fetch rounds over ``link`` while any partition is on it;
        TooSlowError if an answer takes REQUEST_TIMEOUT.

        One cancel scope for the link's life, its deadline set for each
        request and lifted for the rest of the round, rather than a
        ``fail_after`` per request: entering and leaving a new cancel scope
        every round cost ~3-6 % of a follower's GIL-held time."""
        with trio.CancelScope() as answer_due:
            await self._rounds(link, answer_due)
        if answer_due.cancelled_caught:
            raise trio.TooSlowError(f"no answer from {self.address} in {REQUEST_TIMEOUT} s")

    async def _rounds(self, link: ReplicationLink, answer_due: trio.CancelScope) -> None:
        while True:
            if not self.members:
                self._joined = trio.Event()
                with trio.move_on_after(IDLE_CLOSE):
                    await self._joined.wait()
                if not self.members:
                    return
            members = list(self.members.values())
            # Rotated, so that a leader's byte budget serves each in turn.
            self._rotation = (self._rotation + 1) % len(members)
            members = members[self._rotation :] + members[: self._rotation]
            request = encode_fetch_many([member.follower.fetch_frame() for member in members])
            answer_due.deadline = trio.current_time() + REQUEST_TIMEOUT
            answer = await link.request_frame(request)
            if answer_due.cancel_called:
                # The deadline passed just as the answer came: a timeout
                # all the same (the link ends, its partitions start over),
                # so no cancellation can land inside the round's append.
                raise trio.TooSlowError(f"no answer from {self.address} in time")
            answer_due.deadline = math.inf
            if not isinstance(answer, FetchedMany) or len(answer.answers) != len(members):
                raise ReplicationProtocolError(f"unexpected answer {answer!r:.200}")
            await self._apply(list(zip(members, answer.answers, strict=True)))

    async def _apply(self, answered: list[tuple[_Member, Fetched | Refused]]) -> None:
        taken: list[tuple[_Member, Fetched]] = []
        for member, answer in answered:
            if member.ended.is_set():
                continue  # left while its fetch was out
            try:
                fetched = await member.follower.take(answer)
            except (Retry, StorageError) as exc:
                member.end(exc)
                continue
            if fetched is not None:
                taken.append((member, fetched))
        with_runs = [(member, fetched) for member, fetched in taken if fetched.runs]
        failed = await append_together(
            [(member.follower, fetched.runs) for member, fetched in with_runs]
        )
        for member, fetched in taken:
            error = failed.get(member.follower.key)
            if error is not None:
                log.error("%s: replica log failed: %s", member.follower.key, error)
                member.end(error)
                continue
            if member.ended.is_set() or member.follower.stopped:
                continue
            try:
                await member.follower.finish(fetched)
            except StorageError as exc:
                member.end(exc)


async def append_together(
    batch: Sequence[tuple[LinkMember, tuple[ReplicatedRun, ...]]],
) -> dict[tuple[str, int], StorageError | OSError]:
    """Append and fsync every partition's runs in one thread call, each
    owner lending its log (taken in key order); the partitions that failed."""
    if not batch:
        return {}
    ordered = sorted(batch, key=lambda item: item[0].key)
    logs: list[PartitionLog] = []
    try:
        for member, _ in ordered:
            logs.append(await member.owner.borrow())
        return await run_in_thread(partial(_append_each, ordered, logs))
    finally:
        for member, _ in ordered[: len(logs)]:
            member.owner.give_back()


def _append_each(
    ordered: list[tuple[LinkMember, tuple[ReplicatedRun, ...]]], logs: list[PartitionLog]
) -> dict[tuple[str, int], StorageError | OSError]:
    failed: dict[tuple[str, int], StorageError | OSError] = {}
    for (member, runs), partition_log in zip(ordered, logs, strict=True):
        try:
            member.append(runs, partition_log)
        except (StorageError, OSError) as exc:
            failed[member.key] = exc
        finally:
            member.owner.refresh(partition_log)
    return failed


class NodeLinks:
    """This node's links, one per leader address it follows partitions
    from; each runs in ``run``'s nursery while partitions use it."""

    def __init__(self, switch: LinkSwitch) -> None:
        self.switch = switch
        self._links: dict[str, NodeLink] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the links until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def follow(self, follower: LinkMember, address: str) -> None:
        """Fetch for ``follower`` over the link to ``address`` until that
        ends for it: raises what ended it (Retry, a link error, StorageError)."""
        link = self._links.get(address)
        if link is None or link.closed:
            assert self._nursery is not None, "NodeLinks.run is not running"
            link = self._links[address] = NodeLink(address, self.switch)
            self._nursery.start_soon(self._run, link)
        await link.follow(follower)

    async def _run(self, link: NodeLink) -> None:
        try:
            await link.run()
        finally:
            if self._links.get(link.address) is link:
                del self._links[link.address]
