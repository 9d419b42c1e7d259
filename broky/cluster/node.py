"""One node's part in the cluster: membership, the views, the controller.

``ClusterNode.run`` registers the node under a lease, keeps the lease
alive, follows membership and the vbucket states, and campaigns for the
controller. If the lease is lost (etcd unreachable for a whole TTL, the
process paused, an operator revoked it) everything the node did as a
member stops and it registers again, as a new life with a new node epoch:
the controller has meanwhile taken it out of every ISR. A clean stop
revokes the lease, so the others fail over at once instead of after a TTL.
"""

from __future__ import annotations

import logging
import math

import attrs
import trio

from broky.cluster.controller import Controller, load_settings
from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import EtcdError
from broky.cluster.keys import ClusterKeys
from broky.cluster.leadership import Term
from broky.cluster.membership import (
    LeaseKeeper,
    LeaseLost,
    Membership,
    NodeInfo,
    Registration,
    register,
)
from broky.cluster.mirror import PrefixMirror
from broky.cluster.settings import ClusterSettings
from broky.cluster.vbuckets import VbucketTable

log = logging.getLogger(__name__)

#: Node lease TTL in seconds. Failover waits for it: with etcd run with
#: --heartbeat-interval=50 --election-timeout=500 a 1 s lease is 1 s; with
#: etcd's defaults etcd raises it to 2 s (its floor is 1.5 x its election
#: timeout).
DEFAULT_LEASE_TTL = 1

#: How long a starting node waits for its previous life's registration to
#: expire before concluding another process uses its node id.
REGISTER_WAIT = 10.0

#: Pause before registering again after the lease was lost or etcd failed.
REJOIN_DELAY = 0.2
#: Longest pause between attempts to rejoin while etcd is unreachable.
MAX_REJOIN_DELAY = 5.0


@attrs.frozen
class ClusterNodeStatistics:
    """A snapshot of one node's view of the cluster."""

    node_id: str
    #: Registrations so far (1 + lease losses after which it rejoined).
    lives: int
    #: The current life's node epoch (0 between lives).
    node_epoch: int
    #: The controller epoch if this node is the controller, else 0.
    controller_epoch: int
    #: Leader changes this node wrote while controller, in its current life.
    elections: int
    members: int
    vbuckets: int
    vbuckets_led: int
    #: Vbuckets a move is taking elsewhere (broky.cluster.moves), as seen here.
    vbuckets_moving: int
    #: Moves this node started and completed while controller, in its current life.
    moves_started: int
    moves_completed: int


class ClusterNode:
    """This node as a cluster member (see the module docstring)."""

    def __init__(
        self,
        client: EtcdClient,
        keys: ClusterKeys,
        info: NodeInfo,
        settings: ClusterSettings,
        lease_ttl: int = DEFAULT_LEASE_TTL,
        register_wait: float = REGISTER_WAIT,
    ) -> None:
        self.client = client
        self.keys = keys
        self.info = info
        self.proposed_settings = settings
        self.settings = settings
        self.lease_ttl = lease_ttl
        self.register_wait = register_wait
        self.membership = Membership(client, keys)
        self.vbuckets = VbucketTable(client, keys)
        #: The decommission marks (broky.cluster.decommission), for the controller.
        self.marks = PrefixMirror(client, keys.decommissioned)
        #: This life's registration (None between lives).
        self.registration: Registration | None = None
        self.controller: Controller | None = None
        #: Lives so far (1 + times the lease was lost and the node re-registered).
        self.lives = 0
        #: This life's lease renewals (None between lives).
        self._keeper: LeaseKeeper | None = None
        #: Revoke the lease when stopped, so others fail over at once. False
        #: leaves it to expire, as after a crash (fault tests use it).
        self.revoke_on_exit = True

    @property
    def node_id(self) -> str:
        return self.info.node_id

    def node_epoch(self) -> int:
        """This life's node epoch; 0 between lives."""
        registration = self.registration
        return 0 if registration is None else registration.epoch

    def lease_deadline(self) -> float:
        """The last accepted renewal's send time + TTL (LeaseKeeper.valid_until,
        trio time): a lower bound of the lease's expiry; -inf between lives."""
        keeper = self._keeper
        return -math.inf if keeper is None else keeper.valid_until

    def lease_valid(self) -> bool:
        """Whether this life's lease is surely still alive in etcd (before
        ``lease_deadline``). Leaders ack nothing past it, because from then
        on etcd may have elected another leader (broky.replication.gate)."""
        return trio.current_time() < self.lease_deadline()

    def statistics(self) -> ClusterNodeStatistics:
        registration, controller = self.registration, self.controller
        return ClusterNodeStatistics(
            node_id=self.node_id,
            lives=self.lives,
            node_epoch=0 if registration is None else registration.epoch,
            controller_epoch=(controller.epoch or 0) if controller is not None else 0,
            elections=0 if controller is None else controller.elections,
            members=len(self.membership.members()),
            vbuckets=len(self.vbuckets.states()),
            vbuckets_led=len(self.terms()),
            vbuckets_moving=sum(1 for s in self.vbuckets.states().values() if s.state.target),
            moves_started=0 if controller is None else controller.moves_started,
            moves_completed=0 if controller is None else controller.moves_completed,
        )

    def terms(self) -> dict[int, Term]:
        """The vbuckets this life leads, per the latest etcd state seen."""
        registration = self.registration
        if registration is None:
            return {}
        terms = {}
        for vbucket, stored in self.vbuckets.states().items():
            term = Term(vbucket, stored.state.epoch, self.node_id, registration.epoch)
            if term.holds(stored.state):
                terms[vbucket] = term
        return terms

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Be a member until cancelled; started once first registered."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.membership.run)
            await nursery.start(self.vbuckets.run)
            await nursery.start(self.marks.run)
            delay = REJOIN_DELAY
            while True:
                lives = self.lives
                try:
                    await self._live(task_status)
                except* LeaseLost as group:
                    log.warning("node %s lost its lease: %s", self.node_id, group.exceptions[0])
                except* EtcdError as group:
                    log.warning("node %s: etcd failed: %s", self.node_id, group.exceptions[0])
                task_status = trio.TASK_STATUS_IGNORED
                # Rejoin at once after a life; back off while etcd stays away.
                delay = REJOIN_DELAY if self.lives > lives else min(delay * 2, MAX_REJOIN_DELAY)
                await trio.sleep(delay)

    async def _live(self, task_status: trio.TaskStatus[None]) -> None:
        self.settings = await load_settings(self.client, self.keys, self.proposed_settings)
        registration = await register(
            self.client, self.keys, self.info, self.lease_ttl, self.register_wait
        )
        self.registration = registration
        self.lives += 1
        lease = registration.lease
        log.info(
            "node %s joined the cluster (node epoch %d, lease TTL %d s)",
            self.node_id,
            registration.epoch,
            lease.ttl,
        )
        try:
            async with trio.open_nursery() as nursery:
                self._keeper = LeaseKeeper(self.client, lease)
                nursery.start_soon(self._keeper.run)
                self.controller = Controller(
                    self.client,
                    self.keys,
                    self.node_id,
                    lease.id,
                    self.settings,
                    self.membership,
                    vbuckets=self.vbuckets,
                    marks=self.marks,
                )
                nursery.start_soon(self.controller.run)
                task_status.started()
        finally:
            self.registration = None
            self.controller = None
            self._keeper = None
            if self.revoke_on_exit:
                await self._revoke(lease.id)

    async def _revoke(self, lease: int) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            try:
                await self.client.revoke(lease)
            except EtcdError as exc:
                log.warning("could not revoke lease %x: %s", lease, exc)
