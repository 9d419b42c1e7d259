"""A follower's loop for one partition: truncate for the leader's epoch, then fetch.

Pull, as Kafka's replica fetcher, rather than leader push: one mechanism
serves both steady state and catch-up (a restarted or lagging follower just
fetches from its log end), the follower's fsynced end rides on its next
fetch as its ack (no separate ack channel), and a slow follower only slows
itself: the leader holds no send queue per follower. The cost is one extra
round trip per batch against push, which long polls (broky.replication.gate
FETCH_WAIT) keep small.

Order of a follower's duties for leader epoch E (KIP-101 / KIP-279):

1. until the fence reaches E: ask the leader where our latest epoch ends
   in its log (EpochEnd), truncate there (``truncation_step``), repeat
   while the logs do not yet agree; then record E as our fence, durably.
   On a connection of its own: rare, and per partition;
2. join the link to the leader node (broky.replication.node_link), which
   fetches every partition this node follows from it in one request: fetch
   from our log end, append what comes, fsync, and report the new durable
   end in the next fetch; take the leader's high watermark (capped at our
   end) for our readers; store the subscription state that came with the
   answer (broky.subscriptions.replica) and report it stored in the next
   fetch.

Runs whose epoch is newer than our latest add an epoch entry, so our
history matches the leader's and a later failover truncates correctly.
"""

from __future__ import annotations

import logging
from functools import partial

import trio

from broky.cluster.epochs import EpochHistory, truncation_step
from broky.durable.owner import PartitionOwner
from broky.protocol.frames import Run
from broky.replication import epochfile
from broky.replication.faults import LinkSwitch
from broky.replication.frames import FetchTemplate
from broky.replication.gate import PartitionReplica
from broky.replication.link import ReplicationLink, open_stream
from broky.replication.node_link import LINK_ERRORS, REQUEST_TIMEOUT, NodeLinks, Retry
from broky.replication.wire import (
    EpochEnd,
    EpochEnded,
    Fetched,
    RefusalReason,
    Refused,
    ReplicatedRun,
)
from broky.storage.errors import StorageError
from broky.storage.log import PartitionLog

log = logging.getLogger("broky.replication")

#: Pause before retrying after a refusal or a lost link.
RETRY_DELAY = 0.05


class Follower:
    """Follows ``leader_address`` for ``replica`` at leader epoch ``epoch``."""

    def __init__(
        self,
        replica: PartitionReplica,
        leader_address: str,
        epoch: int,
        node_epoch: int,
        switch: LinkSwitch,
        links: NodeLinks,
    ) -> None:
        self.switch = switch
        self.links = links
        #: Set (``stop``) when etcd gives the partition another role.
        self.stopped = False
        self.replica = replica
        self.leader_address = leader_address
        self.epoch = epoch
        self.node_epoch = node_epoch
        #: The leader's subscription state stored here: its journal's
        #: ``(epoch, version)`` (broky.subscriptions.journal; -1: none yet,
        #: so the first answer of this leadership is a resync).
        self.state_epoch = -1
        self.state_version = -1
        owner = replica.owner
        self._fetches = FetchTemplate(
            owner.topic.name, owner.partition, epoch, replica.node_id, node_epoch
        )

    @property
    def key(self) -> tuple[str, int]:
        owner = self.replica.owner
        return owner.topic.name, owner.partition

    @property
    def owner(self) -> PartitionOwner:
        return self.replica.owner

    def stop(self) -> None:
        """Our role ended (broky.replication.service, as it cancels ``run``).
        The link may still hold runs it fetched for us, and nothing may land
        after what the service asks of the log next (a new follower's
        truncation, a dropped copy's deletion): from now on we append and
        restart nothing. ``stopped`` is read in the link's thread call too."""
        self.stopped = True

    async def run(self) -> None:
        """Follow until cancelled (a new etcd state starts a new Follower)."""
        while True:
            await self.switch.wait_healed()
            try:
                if self.replica.fence < self.epoch:
                    if not await self._truncate_alone():
                        await trio.sleep(RETRY_DELAY * 4)
                        continue
                    if self.replica.fence < self.epoch:
                        # A link cut stopped the truncation: no fetch before it ends.
                        raise Retry(f"truncation for epoch {self.epoch} cut short")
                await self.links.follow(self, self.leader_address)
            except LINK_ERRORS as exc:
                log.info("%s: link to %s lost: %r", self.replica.name, self.leader_address, exc)
            except Retry as exc:
                log.debug("%s: %s", self.replica.name, exc)
            except StorageError as exc:
                log.error("%s: replica log failed: %s", self.replica.name, exc)
                await trio.sleep(RETRY_DELAY * 20)
            await trio.sleep(RETRY_DELAY)

    async def _truncate_alone(self) -> bool:
        """Truncate for our epoch on a connection of our own; False if the
        leader cannot be reached."""
        try:
            stream = await open_stream(self.leader_address)
        except OSError as exc:
            log.debug("%s: cannot reach leader %s: %s", self.replica.name, self.leader_address, exc)
            return False
        async with stream:
            with self.switch.link():
                await self._truncate(ReplicationLink(stream))
        return True

    async def _truncate(self, link: ReplicationLink) -> None:
        replica = self.replica
        owner = replica.owner
        while replica.fence < self.epoch:
            latest = replica.history.latest_epoch
            query = EpochEnd(
                owner.topic.name, owner.partition, self.epoch, -1 if latest is None else latest
            )
            with trio.fail_after(REQUEST_TIMEOUT):
                answer = await link.request(query)
            if not isinstance(answer, EpochEnded):
                raise Retry(f"epoch query refused: {answer}")
            before = owner.end_offset
            end, agreed = truncation_step(replica.history, before, answer.found)
            fence = self.epoch if agreed else replica.fence
            await owner.call(partial(_cut, replica.history, end, fence))
            replica.high_watermark = min(replica.high_watermark, end)
            replica.fence = fence
            log.log(
                logging.WARNING if end < before else logging.INFO,
                "%s: log end %d, truncated to %d for epoch %d (agreed: %s)",
                replica.name,
                before,
                end,
                self.epoch,
                agreed,
            )

    def fetch_frame(self) -> bytes:
        """Our next Fetch, framed. Every append is fsynced before the next
        fetch, so our end is durable: it is our ack."""
        end = self.replica.owner.end_offset
        return self._fetches.frame(end, end, self.state_epoch, self.state_version)

    async def take(self, answer: Fetched | Refused) -> Fetched | None:
        """Our partition's answer in a link round: the Fetched to apply, or
        None (we restarted our log at the leader's start); Retry to start
        over (a refusal, an answer from another epoch, our role ended)."""
        if self.stopped:
            raise Retry("the role ended")
        if (
            isinstance(answer, Refused)
            and answer.reason is RefusalReason.BEFORE_LOG_START
            and answer.epoch == self.epoch
            and answer.log_start > self.replica.owner.end_offset
        ):
            await self._restart(answer.log_start)
            return None
        if isinstance(answer, Refused):
            raise Retry(f"fetch from {self.replica.owner.end_offset} refused: {answer}")
        if answer.epoch != self.epoch:
            raise Retry(f"an answer from epoch {answer.epoch}, not {self.epoch}")
        return answer

    async def finish(self, answer: Fetched) -> None:
        """After the link appended the answer's runs: store its subscription
        state (before the next fetch reports it), take the watermark."""
        replica = self.replica
        if answer.state is not None:
            if replica.subscriptions is not None:
                await replica.subscriptions.store(answer.state)
            self.state_epoch, self.state_version = answer.state.epoch, answer.state.version
        replica.high_watermark = max(
            replica.high_watermark, min(answer.high_watermark, replica.owner.end_offset)
        )

    async def _restart(self, start: int) -> None:
        """The leader's retention passed our whole log: keep nothing and
        continue at its log start (we could never fetch the gap)."""
        replica = self.replica
        before = replica.owner.end_offset
        await replica.owner.call(partial(_restart, replica.history, start, replica.fence))
        log.warning(
            "%s: log end %d is below the leader's log start %d: restarted the log there",
            replica.name,
            before,
            start,
        )

    def append(self, runs: tuple[ReplicatedRun, ...], partition_log: PartitionLog) -> None:
        """With the log (lent to the link's thread call): append the runs
        that continue our log, record new epochs, fsync (before the next
        fetch reports them). Nothing once we are stopped (see ``stop``)."""
        if self.stopped:
            return
        history = self.replica.history
        saved = False
        contiguous: list[Run] = []
        producers: list[tuple[int, int]] = []
        end = partition_log.end_offset
        for run in runs:
            if run.base_offset != end:
                break  # not contiguous: the next fetch asks from our end again
            latest = history.latest_epoch
            if latest is None or run.epoch > latest:
                history.assign(run.epoch, run.base_offset)
                saved = True
            contiguous.append(Run(run.key, run.ts_broker, run.count, run.sizes, run.messages))
            producers.append((run.producer, run.sequence))
            end += run.count
        if contiguous:
            # One write for the whole answer, as the leader's group commit;
            # with the producer columns, which a new leader's window needs.
            partition_log.append(
                contiguous,
                [run.ts_broker for run in contiguous],
                producers if any(producer for producer, _ in producers) else None,
            )
        partition_log.sync()
        if saved:
            epochfile.save(partition_log.directory, history, self.replica.fence)


def _cut(history: EpochHistory, end: int, fence: int, partition_log: PartitionLog) -> None:
    """In the owner's thread: truncate the log and its epoch history, durably."""
    partition_log.truncate(end)
    history.truncate(end)
    epochfile.save(partition_log.directory, history, fence)


def _restart(history: EpochHistory, start: int, fence: int, partition_log: PartitionLog) -> None:
    """In the owner's thread: empty the log at ``start`` and forget its
    epochs (the runs fetched next record theirs), durably."""
    partition_log.restart_at(start)
    history.truncate(0)
    epochfile.save(partition_log.directory, history, fence)
