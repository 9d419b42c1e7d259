"""A member's replication: roles from etcd, the fetch server, ISR changes.

``ReplicationService`` runs beside the broker of a cluster member
(``broky serve --cluster ... --replication-listen HOST:PORT``). It gives
every durable partition a ``PartitionReplica`` (broky.replication.gate),
and keeps one task per partition in the role etcd assigns it:

- **leader** of epoch E (the vbucket's leader is this node, in this life):
  record E in the epoch history (fsynced) before taking any publish, then
  lead with a ``LeaderIsr``, proposing ISR shrinks and expansions to etcd by
  compare-and-swap (``change_isr``: it fails once the controller elected
  someone else, and the leader then steps down);
- **follower** of the leader's replication address at epoch E
  (broky.replication.follower);
- **neither** (offline vbucket, not a replica, between lives): refuse.

A role changes only when etcd says so (a new epoch, leader or life), so a
leader paused past its lease learns it was deposed from the watch or from a
failed CAS, and meanwhile can ack only what every member of the last
committed ISR fsynced (wave2 §3.4: the new leader was chosen from that ISR).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import trio

from broky.cluster.epochs import EpochHistory
from broky.cluster.isr import IsrSettings, LeaderIsr
from broky.cluster.leadership import Term
from broky.cluster.placement import vbucket_of
from broky.cluster.state import VbucketState
from broky.cluster.vbuckets import StoredState
from broky.durable.owner import PartitionOwner
from broky.durable.producers import RECOVERY_TAIL_BYTES
from broky.durable.store import DurableStore
from broky.replication import epochfile, vbucket_isr
from broky.replication.dropped import DroppedReplicas
from broky.replication.empty import sync_empty_vbuckets
from broky.replication.events import (
    Advise,
    PartitionReplication,
    ReplicationEvents,
    ReplicationStatistics,
)
from broky.replication.faults import LinkSwitch
from broky.replication.follower import Follower
from broky.replication.gate import PartitionReplica, fetch_all, not_here
from broky.replication.isr_review import IsrReviews
from broky.replication.isr_sync import take_isr
from broky.replication.link import ReplicationLink
from broky.replication.member import Member
from broky.replication.node_link import NodeLinks
from broky.replication.wire import (
    EpochEnd,
    Fetch,
    FetchedMany,
    FetchMany,
    Message,
    PartitionProgress,
    Progress,
    ProgressRequest,
    RefusalReason,
    Refused,
    ReplicationProtocolError,
)
from broky.replication.worker_member import owner_address
from broky.storage.errors import StorageError
from broky.storage.log import PartitionLog

log = logging.getLogger("broky.replication")

#: Seconds between a leader's ISR reviews (lag, expansions): a fraction of
#: replica_lag_max, cheap (no I/O unless the ISR changes).
ISR_CHECK = 0.1
#: Longest the role loop sleeps without an etcd change: catches a new life
#: (registration) that is not an etcd watch event of the tables it follows.
ROLE_RECHECK = 0.25


@attrs.frozen
class _Role:
    """What etcd says this node is for one partition; a change restarts its task."""

    kind: str  # "lead", "follow" or "none"
    term: Term | None = None
    leader_address: str = ""
    epoch: int = 0
    node_epoch: int = 0


class ReplicationService:
    """See the module docstring."""

    def __init__(
        self,
        store: DurableStore,
        node: Member,
        listen: str,
        settings: IsrSettings,
        advise: Advise | None = None,
        *,
        empty_vbuckets: bool = True,
    ) -> None:
        self.store = store
        #: Whether this service keeps the ISR of the node's empty vbuckets
        #: (broky.replication.empty): one per node does, worker 0 of a
        #: several-worker node; a second would only lose every
        #: compare-and-swap to the first, an etcd transaction wasted each.
        self.empty_vbuckets = empty_vbuckets
        self.node = node
        self.listen = listen
        self.settings = settings
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self._roles: dict[tuple[str, int], tuple[_Role, trio.CancelScope]] = {}
        #: The partitions' current followers, stopped with their role.
        self._followers: dict[tuple[str, int], Follower] = {}
        #: Cuts this node's replication links for fault tests (off by default).
        self.switch = LinkSwitch()
        #: One replication link per leader node followed (broky.replication.node_link).
        self.links = NodeLinks(self.switch)
        #: Leader changes, ISR changes, under-replication: counters and advisories.
        self.events = ReplicationEvents(node.node_id, advise)
        #: Serializes the ISR proposals of each vbucket's partitions.
        self.vbucket_locks = vbucket_isr.VbucketLocks()
        #: This node's copies that moves dropped, deleted once each move ends.
        self.dropped = DroppedReplicas(node.node_id)
        #: The led partitions' ISR reviews, proposed to etcd.
        self.reviews = IsrReviews(self.replicas, node, self.events)

    def statistics(self) -> ReplicationStatistics:
        """Every partition's role, log end, high watermark, ISR and follower
        lag, plus the event counters (metrics; read on the trio thread)."""
        partitions = []
        for key, replica in sorted(self.replicas.items()):
            current = self._roles.get(key)
            following = current is not None and current[0].kind == "follow"
            leading = replica.leading
            end = replica.owner.end_offset
            if leading is not None:
                isr = leading.isr
                entry = PartitionReplication(
                    key[0],
                    key[1],
                    "leader",
                    leading.term.epoch,
                    end,
                    replica.high_watermark,
                    tuple(sorted(node for node, _ in isr.committed_isr)),
                    isr.replicas,
                    tuple(sorted(isr.follower_lags().items())),
                )
            else:
                entry = PartitionReplication(
                    key[0],
                    key[1],
                    "follower" if following else "none",
                    replica.fence,
                    end,
                    replica.high_watermark,
                )
            partitions.append(entry)
        events = self.events
        return ReplicationStatistics(
            tuple(partitions), events.leader_changes, events.isr_shrinks, events.isr_expands
        )

    def progress(self) -> Progress:
        """This node's answer to ``broky cluster status`` (broky.cluster.progress)."""
        return Progress(
            self.node.node_id,
            self.node.node_epoch(),
            tuple(
                PartitionProgress(
                    p.topic,
                    p.partition,
                    p.role,
                    p.epoch,
                    p.log_end,
                    p.high_watermark,
                    p.follower_lag,
                )
                for p in self.statistics().partitions
            ),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; started once every partition has its replica."""
        for key, owner in self.store.owners.items():
            history, fence = await owner.call(_load)
            replica = PartitionReplica(
                owner, self.node.node_id, history, fence, self.node.lease_valid
            )
            owner.replica = replica
            self.replicas[key] = replica
        host, _, port = self.listen.rpartition(":")
        listeners = await trio.open_tcp_listeners(int(port), host=host or None)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.links.run)
            nursery.start_soon(trio.serve_listeners, self._serve_connection, listeners)
            nursery.start_soon(self._follow_etcd, nursery)
            vbuckets = self.node.settings.vbuckets
            # Every partition of the node's topics, not only this worker's:
            # another worker's partition is data all the same.
            with_data = {
                vbucket_of(topic.name, p, vbuckets)
                for topic in self.store.policies.policies
                for p in range(topic.partitions)
            }
            if self.empty_vbuckets:
                nursery.start_soon(sync_empty_vbuckets, self.node, with_data)
            if LinkSwitch.enabled():
                nursery.start_soon(self.switch.follow_signals)
            task_status.started()

    # --- roles ------------------------------------------------------------------

    async def _follow_etcd(self, nursery: trio.Nursery) -> None:
        while True:
            self._apply_roles(nursery)
            with trio.move_on_after(ROLE_RECHECK):
                async with trio.open_nursery() as waiters:

                    async def first(wait: Callable[[], object]) -> None:
                        await wait()  # type: ignore[misc]
                        waiters.cancel_scope.cancel()

                    waiters.start_soon(first, self.node.vbuckets.changed)
                    waiters.start_soon(first, self.node.membership.changed)

    def _apply_roles(self, nursery: trio.Nursery) -> None:
        node_epoch = self.node.node_epoch()
        states = self.node.vbuckets.states()
        members = self.node.membership.members()
        vbuckets = self.node.settings.vbuckets
        for key, replica in self.replicas.items():
            stored = states.get(vbucket_of(key[0], key[1], vbuckets))
            state = None if stored is None else stored.state
            role = _Role("none")
            hint = "no leader known"
            if state is not None and state.leader is not None:
                leader = members.get(state.leader)
                if leader is not None:
                    hint = f"leader {state.leader} at {leader.info.address} (epoch {state.epoch})"
                if node_epoch and state.leader == self.node.node_id:
                    term = Term(
                        vbucket_of(key[0], key[1], vbuckets),
                        state.epoch,
                        self.node.node_id,
                        node_epoch,
                    )
                    if term.holds(state):
                        role = _Role("lead", term)
                elif (
                    node_epoch
                    and self.node.node_id in state.replicas
                    and leader is not None
                    and leader.info.replication_address
                ):
                    role = _Role(
                        "follow",
                        None,
                        owner_address(
                            leader.info.replication_address, key[0], key[1], leader.info.workers
                        ),
                        state.epoch,
                        node_epoch,
                    )
            current = self._roles.get(key)
            if current is not None and current[0] == role:
                # A node outside the replica set keeps the role "none" while
                # moves change the leader: its NotLeader must name the new one.
                replica.leader_hint = hint
                if role.kind == "lead" and stored is not None:
                    self._sync_isr(replica, stored.state, stored.kv.mod_revision)
                continue
            if current is not None:
                current[1].cancel()
            stopped = self._followers.pop(key, None)
            if stopped is not None:
                stopped.stop()
            replica.step_down(hint)
            replica.leader_hint = hint
            scope = trio.CancelScope()
            self._roles[key] = (role, scope)
            if role.term is not None and stored is not None:
                nursery.start_soon(self._lead, replica, role.term, stored, hint, scope)
            elif role.kind == "follow":
                follower = Follower(
                    replica,
                    role.leader_address,
                    role.epoch,
                    role.node_epoch,
                    self.switch,
                    self.links,
                )
                self._followers[key] = follower
                nursery.start_soon(_scoped, follower.run, scope)
        self._delete_dropped(states, vbuckets)

    def _delete_dropped(self, states: dict[int, StoredState], vbuckets: int) -> None:
        """Delete the copies completed moves took off this node; after the
        roles above, so a dropped partition's follower is already cancelled."""
        for key, replica in self.replicas.items():
            stored = states.get(vbucket_of(key[0], key[1], vbuckets))
            if self.dropped.dropped(key, None if stored is None else stored.state):
                self.dropped.delete(replica)

    def _sync_isr(self, replica: PartitionReplica, state: VbucketState, revision: int) -> None:
        """Take an ISR the controller changed (a dead follower removed), as
        etcd stored it at ``revision`` (newer ones only: broky.replication.isr_sync)."""
        leading = replica.leading
        if leading is None:
            return
        taken = take_isr(leading, state, revision)
        if taken.refused is not None:
            log.warning("%s: ISR from etcd not taken: %s", replica.name, taken.refused)
        if taken.before is not None:
            self.reviews.changed(replica, leading.isr, taken.before, "controller")
        if taken.refused is not None or taken.before is not None:
            replica.settle()

    async def _lead(
        self,
        replica: PartitionReplica,
        term: Term,
        stored: StoredState,
        hint: str,
        scope: trio.CancelScope,
    ) -> None:
        state = stored.state
        with scope:
            owner = replica.owner
            history = replica.history

            def install(partition_log: PartitionLog) -> tuple[int, list[tuple[int, int, int, int]]]:
                history.assign(term.epoch, partition_log.end_offset)
                epochfile.save(partition_log.directory, history, term.epoch)
                producers = list(partition_log.producer_runs(RECOVERY_TAIL_BYTES))
                return partition_log.end_offset, producers

            end, producers = await owner.call(install)
            # The idempotent producers' window as this log now stands: what
            # it replicated as a follower counts, what was truncated does not.
            owner.reload_producers(producers)
            replica.fence = term.epoch
            isr = LeaderIsr(
                (term.node, term.node_epoch),
                term.epoch,
                state.replicas,
                state.isr,
                end,
                min(replica.high_watermark, end),
                time.monotonic(),
                self.settings,
            )
            replica.lead(term, isr, hint)
            log.info("%s: leading at epoch %d from offset %d", replica.name, term.epoch, end)
            if replica.leading is not None:
                replica.leading.isr_revision = stored.kv.mod_revision
            # Changes etcd made while this log was being installed went by
            # with nobody leading here to take them: take the newest now.
            latest = self.node.vbuckets.states().get(term.vbucket)
            if latest is not None and term.holds(latest.state):
                self._sync_isr(replica, latest.state, latest.kv.mod_revision)
            if replica.subscriptions is not None:
                # The subscriptions as this node stored them (as a follower).
                await replica.subscriptions.lead(term.epoch)
            self.events.led(
                owner.topic.name,
                owner.partition,
                term.epoch,
                (node for node, _ in isr.committed_isr),
                isr.replicas,
            )
            try:
                while True:
                    await trio.sleep(ISR_CHECK)
                    if isr.steady(time.monotonic()):
                        # Nothing to change: no lock (its checkpoints were
                        # most of an idle leader's CPU per led partition).
                        replica.settle()
                        continue
                    async with self.vbucket_locks.lock(term.vbucket):
                        if not await self.reviews.review(replica, isr, term):
                            return
            finally:
                # Cancelled by a role change, this runs after _apply_roles
                # stepped down with the new leader's hint: keep that one.
                replica.step_down(replica.leader_hint)
                self.events.stopped_leading(owner.topic.name, owner.partition)

    # --- serving followers ------------------------------------------------------

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        link = ReplicationLink(stream)
        async with stream:
            if self.switch.cut:
                return
            try:
                with self.switch.link():
                    while True:
                        request = await link.receive()
                        if request is None:
                            return
                        await link.send(await self._answer(request))
            except ReplicationProtocolError as exc:
                log.warning("replication link from %s closed: %s", _peer(stream), exc)
                await link.send(Refused(RefusalReason.NOT_LEADER, 0, f"protocol error: {exc}"))
            except StorageError as exc:
                # Our log failed a read (retention passed the follower, damage):
                # the follower reconnects and the ISR rules judge its lag.
                log.error("replication link from %s closed: %s", _peer(stream), exc)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return

    async def _answer(self, request: Message) -> Message:
        if isinstance(request, ProgressRequest):
            return self.progress()
        if isinstance(request, FetchMany):
            replicas = self.replicas
            fetches = [(replicas.get((f.topic, f.partition)), f) for f in request.fetches]
            return FetchedMany(tuple(await fetch_all(fetches)))
        if not isinstance(request, Fetch | EpochEnd):
            raise ReplicationProtocolError(f"{type(request).__name__} is not a request")
        replica = self.replicas.get((request.topic, request.partition))
        if replica is None:
            return not_here(request)
        if isinstance(request, EpochEnd):
            return replica.epoch_end(request)
        return await replica.fetch(request)


def _load(partition_log: PartitionLog) -> tuple[EpochHistory, int]:
    return epochfile.load(partition_log.directory)


async def _scoped(run: Callable[[], object], scope: trio.CancelScope) -> None:
    with scope:
        await run()  # type: ignore[misc]


def _peer(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername())
    except OSError:
        return "?"


__all__ = ["PartitionOwner", "ReplicationService"]
