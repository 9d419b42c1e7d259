"""A leader's ISR reviews: propose shrinks and expansions to etcd.

Every ``ISR_CHECK`` seconds the task leading a partition
(broky.replication.service) reviews its ISR under the vbucket's lock: the
rules of ``LeaderIsr`` (lag, liveness) give a proposal, the vbucket's
other led partitions must agree to it (one ISR per vbucket in etcd:
broky.replication.vbucket_isr), and the change is a compare-and-swap on the
leader's term (``change_isr_at``). A CAS that finds the term gone deposes
the leader; any other failure keeps the old ISR and tries again at the next
review. Kept apart from the service, which owns the roles, so that the one
path by which a leader changes etcd reads on its own.
"""

from __future__ import annotations

import logging
import time

from broky.cluster.etcd_wire import EtcdError
from broky.cluster.isr import LeaderIsr
from broky.cluster.leadership import Fenced, IsrConflict, Term, change_isr_at
from broky.cluster.state import IsrEntry, StateError
from broky.replication import vbucket_isr
from broky.replication.events import ReplicationEvents
from broky.replication.gate import PartitionReplica
from broky.replication.isr_sync import live_proposal, took_answer
from broky.replication.member import Member

log = logging.getLogger("broky.replication")


class IsrReviews:
    """The reviews of every partition this node leads; ``replicas`` is the
    service's own table (read, never changed here)."""

    def __init__(
        self,
        replicas: dict[tuple[str, int], PartitionReplica],
        node: Member,
        events: ReplicationEvents,
    ) -> None:
        self.replicas = replicas
        self.node = node
        self.events = events

    async def review(self, replica: PartitionReplica, isr: LeaderIsr, term: Term) -> bool:
        """One ISR review of a led partition, under its vbucket's lock:
        propose a change, agreed with the vbucket's other partitions
        (broky.replication.vbucket_isr). False once deposed."""
        proposal = self._proposal(isr)
        replica.settle()
        if proposal is None:
            return True
        siblings = {
            id(other.leading.isr): other
            for other in self.replicas.values()
            if other is not replica and other.leading is not None and other.leading.term == term
        }
        held = [sibling.leading.isr for sibling in siblings.values() if sibling.leading]
        agreed = vbucket_isr.agree(isr, proposal, held)
        if agreed is None:
            return True
        committed = False
        try:
            changed, revision = await change_isr_at(self.node.client, self.node.keys, term, agreed)
            committed = True
        except Fenced as exc:
            log.warning("%s: %s", replica.name, exc)
            replica.step_down(f"deposed at epoch {term.epoch}")
            return False
        except (IsrConflict, EtcdError, StateError, OSError) as exc:
            log.warning("%s: ISR change failed: %s", replica.name, exc)
            isr.isr_failed()
            return True
        finally:
            if not committed:
                vbucket_isr.release(held)
            for sibling in siblings.values():
                sibling.settle()
        log.info("%s: ISR now %s", replica.name, changed.isr)
        before = isr.committed_isr
        isr.isr_committed(changed.isr)
        took_answer(
            [led.leading for led in (replica, *siblings.values()) if led.leading is not None],
            revision,
        )
        self.changed(replica, isr, before, "leader")
        for sibling_isr, sibling_before in vbucket_isr.settle(held, changed.isr):
            self.changed(siblings[id(sibling_isr)], sibling_isr, sibling_before, "leader")
            siblings[id(sibling_isr)].settle()
        replica.settle()
        return True

    def changed(
        self,
        replica: PartitionReplica,
        isr: LeaderIsr,
        before: tuple[IsrEntry, ...],
        by: str,
    ) -> None:
        self.events.isr_changed(
            replica.owner.topic.name,
            replica.owner.partition,
            isr.epoch,
            (node for node, _ in before),
            (node for node, _ in isr.committed_isr),
            isr.replicas,
            by,
        )

    def _proposal(self, isr: LeaderIsr) -> tuple[IsrEntry, ...] | None:
        members = self.node.membership.members()
        live = {(node, member.epoch) for node, member in members.items()}
        return live_proposal(isr, time.monotonic(), live)
