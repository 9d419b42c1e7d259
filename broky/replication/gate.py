"""One replicated partition's role on this node: leader, follower or neither.

``PartitionReplica`` is what the partition's owner (broky.durable.store)
asks before storing a publish, tells once it wrote it (followers fetch it
while the owner fsyncs) and after fsyncing it (the ``ReplicaGate``
protocol), and what the replication server asks when a follower fetches.
It lives on the trio thread; the epoch history it holds changes only
inside the owner's rounds (the log's thread), next to the log.

As leader of epoch E it holds a ``LeaderIsr`` (broky.cluster.isr): a round
of publishes is delivered and acked once the high watermark passes it, and
failed with NotLeader if this node stops leading first (the records may
survive on the new leader: the client cannot know, and retries). As a
follower or an outsider it refuses publishes with NotLeader naming the
leader it knows.

A leader also answers nothing while its node's lease may have expired in
etcd (``lease_valid``: past the last renewal's send time + TTL, a lower
bound of the expiry). Cut off from etcd but not from its followers, it
would otherwise keep acking until a follower tells it of the new epoch,
after etcd had already handed the partition to someone else (safe for the
data, which every ISR member holds, but an ack from a node that no longer
leads; the link-partition test counts those). The held rounds wait, and
fail with NotLeader when the node steps down.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from broky.cluster.epochs import EpochHistory
from broky.cluster.isr import Acks, LeaderIsr, Outcome
from broky.cluster.leadership import Term
from broky.durable.owner import PartitionOwner
from broky.durable.producers import Identity
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Run
from broky.replication.epochfile import epoch_at
from broky.replication.leading import HeldRound, Leading
from broky.replication.wire import (
    FETCH_MAX_BYTES,
    EpochEnd,
    EpochEnded,
    Fetch,
    Fetched,
    RefusalReason,
    Refused,
    ReplicatedRun,
    StateUpdate,
)
from broky.storage.errors import OffsetOutOfRangeError
from broky.storage.log import PartitionLog

#: Longest a fetch that found nothing new waits for new data (a long poll):
#: short enough that acks in the next fetch keep a follower's lag fresh
#: for the ISR rules, long enough that an idle partition costs ~5 round
#: trips a second per follower.
FETCH_WAIT = 0.2

#: Longest a long poll woken for a new high watermark alone waits for new
#: runs to carry it with. The wake comes when every round is acked, which
#: under acks=all is when the clients get their acks and publish again
#: within a millisecond or so: without the linger each follower took one
#: empty answer and one fetch more per round, a round trip of CPU on both
#: sides on a machine where that CPU is what limits the throughput. The
#: followers' watermark (for their readers, and where a new leader starts
#: from) is this much later when the partition goes idle.
WATERMARK_LINGER = 0.005


class SubscriptionRole(Protocol):
    """What the partition's durable subscriptions do with its role
    (broky.subscriptions.replica): their state moves with the partition."""

    async def lead(self, epoch: int) -> None:
        """Serve the subscriptions from the state stored here (before the
        partition takes publishes as leader of ``epoch``)."""

    def step_down(self) -> None:
        """Stop serving them (this node no longer leads)."""

    def state_since(self, epoch: int, version: int) -> StateUpdate | None:
        """As leader: the state a follower at ``(epoch, version)`` lacks."""

    def readable(self, high_watermark: int) -> None:
        """As leader: the high watermark moved. Rounds this node stored as
        leader announce themselves when acked; what it took over from the
        previous leader becomes readable only this way."""

    async def store(self, update: StateUpdate) -> None:
        """As follower: store the leader's ``update`` durably."""


class PartitionReplica:
    """See the module docstring. ``owner`` is the partition's PartitionOwner."""

    def __init__(
        self,
        owner: PartitionOwner,
        node_id: str,
        history: EpochHistory,
        fence: int,
        lease_valid: Callable[[], bool] = lambda: True,
    ) -> None:
        self.owner = owner
        self.node_id = node_id
        #: Whether this node's lease is surely still alive in etcd
        #: (ClusterNode.lease_valid); see the module docstring.
        self.lease_valid = lease_valid
        #: (epoch, start offset) of this log; see broky.replication.epochfile.
        self.history = history
        #: The newest epoch this log was truncated for (a follower's fence).
        self.fence = fence
        #: Readers stop here. 0 after a restart until a leader says more.
        self.high_watermark = 0
        self.leading: Leading | None = None
        #: "leader NODE at HOST:PORT (epoch E)", for NotLeader answers.
        self.leader_hint = "no leader known"
        #: The topic's acks setting: "leader" acks at this node's fsync
        #: (lost if it fails before a follower has it), "all" at the HW.
        self.acks = Acks(owner.topic.acks)
        #: The partition's durable subscriptions (None: none attached yet).
        self.subscriptions: SubscriptionRole | None = None
        #: Fetches waiting for something new here (``watch``).
        self._waiters: set[trio.Event] = set()

    @property
    def name(self) -> str:
        return f"{self.owner.topic.name}/{self.owner.partition}"

    # --- ReplicaGate (broky.durable.store) -------------------------------------

    def not_leading(self) -> str:
        """Why this node refuses to serve the partition while it does not
        lead: the known leader, or, when etcd already names this node and it
        is still taking over (truncating, reloading subscription state),
        that, rather than a leader hint naming the refusing node itself."""
        if self.leader_hint.startswith(f"leader {self.node_id} "):
            return (
                f"{self.node_id} is taking over the lead of {self.name} "
                f"({self.leader_hint}); retry shortly"
            )
        return f"{self.node_id} does not lead {self.name}; {self.leader_hint}"

    def refusal(self) -> tuple[ErrorCode, str] | None:
        leading = self.leading
        if leading is None:
            return ErrorCode.NOT_LEADER, self.not_leading()
        if not self.lease_valid():
            return (
                ErrorCode.NOT_LEADER,
                f"{self.node_id} may have lost its cluster lease; {self.leader_hint}",
            )
        if leading.isr.check_publish(self.acks) is Outcome.NOT_ENOUGH_REPLICAS:
            return ErrorCode.NOT_ENOUGH_REPLICAS, self._too_few(leading)
        return None

    def written(
        self,
        offset: int,
        runs: Sequence[Run],
        stamps: Sequence[int],
        producers: Sequence[Identity] | None,
    ) -> None:
        """The owner wrote ``runs`` from ``offset`` and is fsyncing them now
        (queued from its round's thread): followers fetch them at once, so
        their write and fsync overlap ours instead of following it (Kafka
        and Redpanda replicate in parallel with the leader's flush too). No
        ack gets earlier than our fsync: the high watermark counts our
        fsynced end, which only ``hold`` reports (``LeaderIsr.synced``)."""
        leading = self.leading
        if leading is None or not runs or offset != leading.isr.log_end:
            return  # not leading, or ``hold`` already took this round
        end = offset + sum(run.count for run in runs)
        held = HeldRound(end)
        leading.tokens.append(held)
        leading.written.append(held)
        leading.remember(offset, runs, stamps, producers)
        leading.isr.appended(end, len(leading.tokens), self.acks)
        self._wake()  # followers waiting in a long poll fetch it now

    def hold(
        self,
        offset: int,
        runs: Sequence[Run],
        stamps: Sequence[int],
        deliver: Callable[[], None],
        fail: Callable[[ErrorCode, str], None],
        producers: Sequence[Identity] | None = None,
    ) -> None:
        end = offset + sum(run.count for run in runs)
        leading = self.leading
        if leading is None:
            fail(
                ErrorCode.NOT_LEADER,
                f"{self.node_id} stopped leading {self.name}; {self.leader_hint}",
            )
            return
        written = leading.written
        while written and written[0].end < end:
            written.popleft()  # its fsync failed: the owner answered the error
        if runs and written and written[0].end == end:
            # ``written`` showed it to the followers already: waking them
            # again would only answer their long polls empty.
            written.popleft().attach(deliver, fail)
        else:
            leading.tokens.append(HeldRound(end, deliver, fail))
            leading.remember(offset, runs, stamps, producers)
            leading.isr.appended(end, len(leading.tokens), self.acks)
            self._wake()  # followers waiting in a long poll fetch it now
        leading.isr.synced(end)
        self.settle()

    # --- leadership ------------------------------------------------------------

    def lead(self, term: Term, isr: LeaderIsr, hint: str) -> None:
        """Start leading (the epoch is already in the history, durably)."""
        self.step_down(hint)
        self.leading = Leading(term, isr)
        self.high_watermark = isr.high_watermark
        self.leader_hint = hint
        self._wake()

    def step_down(self, hint: str) -> None:
        """Stop leading: every held round fails with NotLeader (its records
        may or may not survive the failover)."""
        self.leader_hint = hint
        leading, self.leading = self.leading, None
        if self.subscriptions is not None:
            self.subscriptions.step_down()
        if leading is None:
            return
        reason = f"{self.node_id} stopped leading {self.name} at epoch {leading.term.epoch}; {hint}"
        while leading.tokens:
            leading.tokens.popleft().fail(ErrorCode.NOT_LEADER, reason)
        self._wake()

    def settle(self) -> None:
        """Answer the held rounds the high watermark now covers (none while
        the lease may be gone: the leader's loop settles again soon)."""
        leading = self.leading
        if leading is None or not self.lease_valid():
            return
        for answer in leading.isr.answers():
            held = leading.tokens.popleft()
            if answer.outcome is Outcome.ACKED:
                held.deliver()
            else:
                held.fail(ErrorCode.NOT_ENOUGH_REPLICAS, self._too_few(leading))
        if leading.isr.high_watermark != self.high_watermark:
            self.high_watermark = leading.isr.high_watermark
            if self.subscriptions is not None:
                self.subscriptions.readable(self.high_watermark)
            if self.high_watermark >= leading.isr.log_end:
                # Nothing newer is on its way to the followers to carry the
                # watermark: tell the waiting ones now. Under load the next
                # round's answer carries it instead, and a wake here would
                # answer each follower's long poll empty once per round.
                self._wake()

    def _too_few(self, leading: Leading) -> str:
        return (
            f"{self.name}: {len(leading.isr.committed_isr)} replicas in sync, "
            f"{leading.isr.settings.min_insync} needed; retry shortly"
        )

    def state_changed(self) -> None:
        """The subscriptions committed new state: followers fetch it now."""
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            waiter.set()

    # --- serving followers -------------------------------------------------------

    def _check_term(self, epoch: int) -> Refused | Leading:
        leading = self.leading
        if leading is None:
            return Refused(RefusalReason.NOT_LEADER, self.fence, self.leader_hint)
        if epoch > leading.term.epoch:
            return Refused(RefusalReason.FENCED, leading.term.epoch)
        if epoch < leading.term.epoch:
            return Refused(RefusalReason.STALE_EPOCH, leading.term.epoch)
        return leading

    def epoch_end(self, request: EpochEnd) -> EpochEnded | Refused:
        leading = self._check_term(request.epoch)
        if isinstance(leading, Refused):
            return leading
        found = self.history.end_for(request.last_epoch, self.owner.end_offset)
        return EpochEnded(leading.term.epoch, found)

    async def fetch(self, request: Fetch) -> Fetched | Refused:
        """One partition's fetch: ``fetch_all`` of it alone."""
        (answer,) = await fetch_all([(self, request)])
        return answer

    def take_fetch(self, request: Fetch) -> Leading | Refused:
        """A fetch's first half, before any wait: check its epoch (a
        follower at a newer one has seen us deposed), count the follower's
        ack, check its offset. The leadership to answer it under, or the
        refusal to answer."""
        leading = self._check_term(request.epoch)
        if isinstance(leading, Refused):
            if leading.reason is RefusalReason.FENCED:
                # The follower follows a newer epoch: etcd has moved on.
                self.step_down(f"deposed: a follower is at epoch {request.epoch}")
            return leading
        leading.isr.follower_ack(
            request.node, request.node_epoch, request.epoch, request.durable, time.monotonic()
        )
        self.settle()
        if request.offset > self._log_end(leading):
            return Refused(RefusalReason.OUT_OF_RANGE, leading.term.epoch)
        if request.offset < self.owner.start_offset:
            return self._before_start(leading, request.offset)
        return leading

    def has_news(self, leading: Leading, request: Fetch) -> bool:
        """Whether the answer to ``request`` would carry more than the high
        watermark: runs, subscription state or a change of leadership."""
        return not (
            self.leading is leading
            and request.offset == self._log_end(leading)
            and self._state_for(request) is None
        )

    def watch(self, waiter: trio.Event) -> None:
        """Set ``waiter`` whenever followers have something to fetch here,
        until ``unwatch``."""
        self._waiters.add(waiter)

    def unwatch(self, waiter: trio.Event) -> None:
        self._waiters.discard(waiter)

    async def answer_fetch(
        self, leading: Leading, request: Fetch, max_bytes: int
    ) -> Fetched | Refused:
        """A fetch's second half, after any wait: runs from its offset, up
        to ``max_bytes`` (at least one run unless it is 0 or less)."""
        if self.leading is not leading:
            return Refused(RefusalReason.NOT_LEADER, self.fence, self.leader_hint)
        state = self._state_for(request)
        history = self.history

        def read(partition_log: PartitionLog) -> list[ReplicatedRun]:
            return [
                ReplicatedRun(
                    epoch_at(history, batch.base_offset),
                    batch.base_offset,
                    batch.count,
                    batch.key,
                    batch.ts_broker,
                    bytes(batch.sizes),
                    bytes(batch.messages),
                    batch.producer,
                    batch.sequence,
                )
                for batch in partition_log.read(request.offset, max_bytes)
            ]

        runs: list[ReplicatedRun] = []
        if max_bytes > 0 and request.offset < self._log_end(leading):
            try:
                runs = leading.recent_from(request.offset, max_bytes) or await self.owner.call(read)
            except OffsetOutOfRangeError:
                # Retention ran between the check above and the read.
                return self._before_start(leading, request.offset)
        return Fetched(leading.term.epoch, self.high_watermark, tuple(runs), state)

    def _log_end(self, leading: Leading) -> int:
        """Where the leader's log ends for fetchers: past the owner's last
        finished round by any round written and still being fsynced."""
        return max(self.owner.end_offset, leading.isr.log_end)

    def _state_for(self, request: Fetch) -> StateUpdate | None:
        subscriptions = self.subscriptions
        if subscriptions is None:
            return None
        return subscriptions.state_since(request.state_epoch, request.state_version)

    def _before_start(self, leading: Leading, offset: int) -> Refused:
        """Retention deleted ``offset``: without this answer the follower
        would ask for it forever (Kafka's OffsetOutOfRange to a follower)."""
        start = self.owner.start_offset
        return Refused(
            RefusalReason.BEFORE_LOG_START,
            leading.term.epoch,
            f"{self.name}: offset {offset} is below the log start {start}",
            start,
        )


async def fetch_all(
    fetches: Sequence[tuple[PartitionReplica | None, Fetch]],
) -> list[Fetched | Refused]:
    """Answer a follower's fetches of the partitions it follows from this
    node, in one round trip (broky.replication.node_link), in order.

    Each partition is judged on its own, as if fetched alone: its epoch and
    fencing, its follower's ack, its offset; a refusal answers that
    partition only (None for a partition this node does not have: refused
    as not led here). If none of them has anything for the follower but the
    high watermark, the answer waits up to FETCH_WAIT for any to get some
    (then WATERMARK_LINGER, as for one). Runs total FETCH_MAX_BYTES at most
    (and one run more), the first partitions first: the follower rotates
    the order, so each gets its turn while it catches up.
    """
    taken = [
        not_here(request) if replica is None else replica.take_fetch(request)
        for replica, request in fetches
    ]

    def quiet() -> bool:
        return all(
            replica is not None
            and isinstance(leading, Leading)
            and not replica.has_news(leading, request)
            for (replica, request), leading in zip(fetches, taken, strict=True)
        )

    if quiet():
        await _wait_for_news([replica for replica, _ in fetches if replica is not None], quiet)
    answers: list[Fetched | Refused] = []
    budget = FETCH_MAX_BYTES
    for (replica, request), leading in zip(fetches, taken, strict=True):
        if replica is None or isinstance(leading, Refused):
            assert isinstance(leading, Refused)
            answers.append(leading)
            continue
        answer = await replica.answer_fetch(leading, request, budget)
        if isinstance(answer, Fetched):
            budget -= sum(len(run.messages) for run in answer.runs)
        answers.append(answer)
    return answers


def not_here(request: Fetch | EpochEnd) -> Refused:
    """The answer about a partition this node does not have."""
    return Refused(
        RefusalReason.NOT_LEADER, 0, f"no partition {request.topic}/{request.partition} here"
    )


async def _wait_for_news(replicas: list[PartitionReplica], quiet: Callable[[], bool]) -> None:
    """A long poll over ``replicas``: until one has news, FETCH_WAIT at most.
    Under acks=all nearly every fetch waits here (it brings the ack that
    lets the clients publish the next round), so it is one event and one
    cancel scope, the scope's deadline shortened for a linger."""
    waiter = trio.Event()
    for replica in replicas:
        replica.watch(waiter)
    try:
        with trio.move_on_after(FETCH_WAIT) as scope:
            await waiter.wait()
            if quiet():
                # Woken for the high watermark alone: give the next round a
                # moment to carry it (see WATERMARK_LINGER).
                for replica in replicas:
                    replica.unwatch(waiter)
                waiter = trio.Event()
                for replica in replicas:
                    replica.watch(waiter)
                scope.deadline = min(scope.deadline, trio.current_time() + WATERMARK_LINGER)
                await waiter.wait()
    finally:
        for replica in replicas:
            replica.unwatch(waiter)
