"""The controller: one node at a time writes placement and elects leaders.

Election: the ``controller`` key is created if absent, attached to the
candidate's lease; its ``create_revision`` is the controller epoch. Every
controller write is one etcd txn guarded by "``controller`` still has my
create_revision" *and* "each vbucket key still has the mod_revision I read"
(create_revision 0 for a new key), so a deposed controller's writes and a
concurrent change by a leader (an ISR change) both fail the compare and the
controller re-reads. Two controllers can never both win: etcd's
create-if-absent is atomic, and a controller that lost its lease without
knowing it cannot write.

Duties, on every membership change (and every ``RECHECK_INTERVAL``):

- once enough nodes are live (``replication_factor``), create the vbucket
  map of a new cluster (broky.cluster.placement) with every replica in sync;
- apply broky.cluster.state.after_membership to every vbucket: dead or
  restarted nodes leave the ISR, vbuckets whose leader left get a new one
  from the ISR with epoch + 1;
- rebalance (broky.cluster.moves): take the next step of every move in
  progress, and start moves towards the balanced map when a node joined or
  was removed for good (``decommissioned/``), a few vbuckets at a time.
  While moves are in progress it also wakes on vbucket changes, since a
  move advances when a leader adds a caught-up replica to its ISR.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import attrs
import trio

from broky.cluster.decommission import decommissioned_of
from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import Compare, EtcdError, EventType, Get, Put
from broky.cluster.keys import ClusterKeys
from broky.cluster.membership import Membership, members_of
from broky.cluster.moves import DEFAULT_MAX_MOVES, changes
from broky.cluster.placement import place
from broky.cluster.settings import ClusterSettings
from broky.cluster.state import VbucketState, initial_state
from broky.cluster.vbuckets import StoredState, states_of

log = logging.getLogger(__name__)

#: Vbucket keys written per txn: etcd allows 128 operations per list
#: (--max-txn-ops); 64 keeps one election round for a 3-node, 256-vbucket
#: cluster (about 85 vbuckets led per node) at two txns.
KEYS_PER_TXN = 64

#: How often the controller re-checks everything without a membership
#: change, so a write lost to an etcd hiccup is retried.
RECHECK_INTERVAL = 5.0

#: Pause before retrying after etcd failed a request.
RETRY_DELAY = 0.1


class View(Protocol):
    """A live copy of etcd keys the controller follows (broky.cluster.mirror)."""

    @property
    def revision(self) -> int:
        """The etcd revision of the last change applied."""

    async def changed(self) -> None:
        """Return after the next change applied."""


@attrs.frozen
class Write:
    """One vbucket change: ``mod_revision`` 0 creates the key."""

    vbucket: int
    mod_revision: int
    old: VbucketState | None
    state: VbucketState


class NotController(Exception):
    """This node's controller epoch is over (another controller was elected
    or its lease ended): it must stop writing and campaign again."""


async def load_settings(
    client: EtcdClient, keys: ClusterKeys, proposed: ClusterSettings
) -> ClusterSettings:
    """The cluster's settings: ``proposed`` if this is the first node to
    write them, else what is stored (a difference is logged)."""
    data = proposed.to_json()
    result = await client.txn(
        [Compare.created(keys.config, 0)], [Put(keys.config, data)], [Get(keys.config)]
    )
    if result.succeeded:
        return proposed
    stored = ClusterSettings.from_json(result.ranges[0][0].value)
    if stored != proposed:
        log.warning("cluster settings in etcd %s differ from this node's %s", stored, proposed)
    return stored


class Controller:
    """Campaigns for the controller key with ``lease`` and, while elected,
    keeps placement and leadership current with ``membership``."""

    def __init__(
        self,
        client: EtcdClient,
        keys: ClusterKeys,
        node_id: str,
        lease: int,
        settings: ClusterSettings,
        membership: Membership,
        *,
        vbuckets: View | None = None,
        marks: View | None = None,
        max_moves: int = DEFAULT_MAX_MOVES,
    ) -> None:
        """``vbuckets`` and ``marks``: the node's views of the vbucket states
        and the decommission marks, so that moves start and advance as soon
        as those change; without them, within RECHECK_INTERVAL."""
        self.client = client
        self.keys = keys
        self.node_id = node_id
        self.lease = lease
        self.settings = settings
        self.membership = membership
        self.vbuckets = vbuckets
        self.marks = marks
        self.max_moves = max_moves
        #: The controller epoch while this node is the controller, else None.
        self.epoch: int | None = None
        #: Leader changes this node wrote as controller (one per vbucket).
        self.elections = 0
        #: Moves this node started and completed as controller.
        self.moves_started = 0
        self.moves_completed = 0
        #: Vbuckets moving after the last plan (while > 0, vbucket changes wake us).
        self.moving = 0

    async def run(self) -> None:
        """Campaign, lead while elected, campaign again; until cancelled."""
        while True:
            try:
                epoch = await self.campaign()
                self.epoch = epoch
                log.info("node %s is the controller (epoch %d)", self.node_id, epoch)
                await self._lead(epoch)
            except NotController as exc:
                log.info("node %s is no longer the controller: %s", self.node_id, exc)
            except EtcdError as exc:
                log.warning("controller: etcd request failed (%s), retrying", exc)
                await trio.sleep(RETRY_DELAY)
            finally:
                self.epoch = None

    async def campaign(self) -> int:
        """Wait until this node is the controller; returns its epoch."""
        key = self.keys.controller
        while True:
            result = await self.client.txn(
                [Compare.created(key, 0)],
                [Put(key, self.node_id.encode(), self.lease)],
                [Get(key)],
            )
            if result.succeeded:
                return result.revision
            (holder,) = result.ranges[0] or (None,)
            if holder is None:
                continue  # deleted between the compare and the read
            if holder.lease == self.lease:
                return holder.create_revision  # our own txn, answered late
            async with self.client.watch(key, start_revision=result.revision + 1) as stream:
                async for batch in stream:
                    if any(event.type is EventType.DELETE for event in batch.events):
                        break

    async def _lead(self, epoch: int) -> None:
        while True:
            seen = {id(view): view.revision for view in self._views(moving=True)}
            await self.reconcile(epoch)
            views = self._views(moving=self.moving > 0)
            if any(view.revision != seen[id(view)] for view in views):
                continue  # it changed while we planned: plan again at once
            with trio.move_on_after(RECHECK_INTERVAL):
                async with trio.open_nursery() as waiters:
                    for view in views:
                        waiters.start_soon(_first, view, waiters.cancel_scope)

    def _views(self, moving: bool) -> list[View]:
        """What the controller follows: membership and removals, and the
        vbucket states while something moves (a move advances when a
        leader adds a caught-up replica to its ISR)."""
        views = [self.membership, self.marks, self.vbuckets if moving else None]
        return [view for view in views if view is not None]

    async def reconcile(self, epoch: int) -> None:
        """Bring every vbucket in line with the current membership: plan and
        write until a plan has nothing to write (a move's completion lets
        the next one start; a race lost means re-reading)."""
        while True:
            # Members, states and marks from one read: the membership view
            # (``self.membership``, a watch of its own) only wakes us. It
            # may lag the states: a controller elected on the watch of the
            # controller key has seen the old one's death before its
            # membership watch has, and planning with that view took every
            # live node out of the ISRs and kept the dead one.
            found = await self.client.txn(
                [],
                [
                    Get.prefix(self.keys.nodes),
                    Get.prefix(self.keys.vbuckets),
                    Get.prefix(self.keys.decommissioned),
                ],
            )
            nodes, vbuckets, marks = found.ranges
            members = members_of(self.keys, {kv.key: kv for kv in nodes})
            live = {node: member.epoch for node, member in members.items()}
            stored = states_of(self.keys, {kv.key: kv for kv in vbuckets})
            writes = self._plan(stored, live, decommissioned_of(self.keys, marks))
            if not writes:
                return
            await self._write(epoch, writes)

    def _plan(
        self, stored: dict[int, StoredState], live: dict[str, int], decommissioned: set[str]
    ) -> list[Write]:
        """Every change to make, with the mod_revision to compare."""
        writes: list[Write] = []
        missing = [v for v in range(self.settings.vbuckets) if v not in stored]
        if missing and len(live) >= self.settings.replication_factor:
            current = [
                stored[v].state.replicas if v in stored else ()
                for v in range(self.settings.vbuckets)
            ]
            target = place(current, live, self.settings.vbuckets, self.settings.replication_factor)
            writes.extend(Write(v, 0, None, initial_state(target[v], live)) for v in missing)
        placed = {v: entry.state for v, entry in stored.items()}
        changed = changes(placed, live, decommissioned, self.settings, self.max_moves)
        writes.extend(
            Write(v, stored[v].kv.mod_revision, placed[v], state)
            for v, state in sorted(changed.items())
        )
        self.moving = sum(1 for v, state in placed.items() if changed.get(v, state).target)
        return writes

    async def _write(self, epoch: int, writes: Sequence[Write]) -> None:
        """Write ``writes`` in CAS txns, stopping at the first that lost a
        race (the caller re-reads and plans again); NotController if our
        epoch is over."""
        guard = Compare.created(self.keys.controller, epoch)
        for start in range(0, len(writes), KEYS_PER_TXN):
            batch = writes[start : start + KEYS_PER_TXN]
            compares = [guard]
            puts = []
            for write in batch:
                key = self.keys.vbucket(write.vbucket)
                compares.append(
                    Compare.modified(key, write.mod_revision)
                    if write.mod_revision
                    else Compare.created(key, 0)
                )
                puts.append(Put(key, write.state.to_json()))
            result = await self.client.txn(compares, puts, [Get(self.keys.controller)])
            if not result.succeeded:
                holders = result.ranges[0]
                if not holders or holders[0].create_revision != epoch:
                    raise NotController("the controller key changed")
                log.debug("a vbucket changed while the controller planned; re-reading")
                return
            for write in batch:
                if write.old is None:
                    log.debug("vbucket %d placed: %s", write.vbucket, describe(write.state))
                    continue
                if write.old.leader != write.state.leader:
                    self.elections += 1
                if write.state.target and not write.old.target:
                    self.moves_started += 1
                elif write.old.target and not write.state.target:
                    self.moves_completed += 1
                log.info("vbucket %d: %s", write.vbucket, describe(write.state))


def describe(state: VbucketState) -> str:
    """A vbucket state in one short line, for logs."""
    isr = ",".join(node for node, _ in state.isr)
    leader = state.leader or "OFFLINE"
    line = f"leader {leader} epoch {state.epoch} isr [{isr}] replicas [{','.join(state.replicas)}]"
    return f"{line} moving to [{','.join(state.target)}]" if state.target else line


async def _first(view: View, scope: trio.CancelScope) -> None:
    """Wait for ``view`` to change, then end the waits of ``scope``."""
    await view.changed()
    scope.cancel()
