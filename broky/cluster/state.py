"""A vbucket's replication state and the rules that change it, as data.

One etcd key per vbucket (``vb/<n>``) holds its replicas, its leader, the
leader epoch and the in-sync replicas (ISR). Every change is a
compare-and-swap on the key's ``mod_revision`` (broky.cluster.controller,
broky.cluster.leadership), so two writers can never both win.

ISR entries are ``(node, node_epoch)``: a node that restarted has a new
epoch (broky.cluster.membership) and is not in sync until the leader adds it
back, even if the controller never saw it gone (Kafka's KIP-903).

The leader epoch goes up by one at every change of leader, including a
vbucket going offline. It is the fencing token: a leader acts only for its
epoch, and whoever receives its writes refuses an epoch older than the
newest it has seen, because leases alone cannot stop a paused leader from
believing it still leads (Jepsen, etcd 3.4.3).

This module does no I/O: the controller applies ``after_membership`` to
what it read and writes the result with a CAS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

#: An ISR entry: a node and the epoch of the life in which it was in sync.
IsrEntry = tuple[str, int]


class StateError(ValueError):
    """A ``vb/<n>`` value that is not a valid vbucket state."""


@attrs.frozen
class VbucketState:
    """``replicas`` in preference order; ``leader`` None means offline.

    ``target`` is the replica set a move is taking the vbucket to (empty:
    no move; broky.cluster.moves). It is stored with the state so that a
    new controller carries on a move its predecessor began."""

    replicas: tuple[str, ...]
    leader: str | None
    epoch: int
    isr: tuple[IsrEntry, ...]
    target: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        fields: dict[str, object] = {
            "replicas": list(self.replicas),
            "leader": self.leader,
            "epoch": self.epoch,
            "isr": [list(entry) for entry in self.isr],
        }
        if self.target:
            fields["target"] = list(self.target)
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> VbucketState:
        try:
            fields = json.loads(data)
            replicas = tuple(str(node) for node in fields["replicas"])
            leader = fields["leader"]
            isr = tuple((str(node), int(epoch)) for node, epoch in fields["isr"])
            target = tuple(str(node) for node in fields.get("target", ()))
            state = cls(
                replicas, None if leader is None else str(leader), int(fields["epoch"]), isr, target
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(f"not a vbucket state: {data[:200]!r} ({exc})") from exc
        state.check()
        return state

    def check(self) -> None:
        """Raise StateError unless the invariants hold: distinct replicas, an
        ISR within them, a leader in the ISR, a target of distinct nodes."""
        if len(set(self.replicas)) != len(self.replicas):
            raise StateError(f"replicas repeat a node: {self.replicas}")
        if len(set(self.target)) != len(self.target):
            raise StateError(f"target repeats a node: {self.target}")
        isr_nodes = [node for node, _ in self.isr]
        if len(set(isr_nodes)) != len(isr_nodes) or not set(isr_nodes) <= set(self.replicas):
            raise StateError(f"ISR {self.isr} is not a set of replicas {self.replicas}")
        if self.leader is not None and self.leader not in isr_nodes:
            raise StateError(f"leader {self.leader} is not in the ISR {self.isr}")
        if self.epoch < 0:
            raise StateError(f"epoch must be >= 0, got {self.epoch}")

    def leader_epoch_of_node(self) -> int | None:
        """The node epoch with which the leader is in the ISR (None: offline)."""
        for node, node_epoch in self.isr:
            if node == self.leader:
                return node_epoch
        return None


def initial_state(replicas: Sequence[str], live: Mapping[str, int]) -> VbucketState:
    """A new vbucket: led by its preferred replica, every replica in sync
    (they are all empty), epoch 1."""
    isr = tuple((node, live[node]) for node in replicas)
    return VbucketState(tuple(replicas), replicas[0] if replicas else None, 1, isr)


def after_membership(state: VbucketState, live: Mapping[str, int]) -> VbucketState | None:
    """What the controller writes after membership changed (None: nothing).

    ``live`` maps each live node to its current epoch. ISR entries of dead
    or restarted nodes leave the ISR. A vbucket whose leader left gets the
    first replica, in preference order, that is in the ISR and alive in the
    same life, with epoch + 1. Failing that, an ISR member that restarted
    leads (see ``_returning``); failing that, the vbucket goes offline
    (leader None, epoch + 1) keeping its last ISR, and comes back when one
    of those nodes returns. A replica that was not in sync never leads (no
    unclean election). Applying the rules to their own result changes
    nothing."""
    in_sync = tuple(entry for entry in state.isr if live.get(entry[0]) == entry[1])
    leader_alive = state.leader is not None and (state.leader, live.get(state.leader)) in in_sync
    if leader_alive:
        return None if in_sync == state.isr else attrs.evolve(state, isr=in_sync)
    eligible = {node for node, _ in in_sync}
    for node in state.replicas:
        if node in eligible:
            return attrs.evolve(state, leader=node, epoch=state.epoch + 1, isr=in_sync)
    returning = _returning(state, live)
    if returning is not None or state.leader is None:
        return returning
    return attrs.evolve(state, leader=None, epoch=state.epoch + 1)


def _returning(state: VbucketState, live: Mapping[str, int]) -> VbucketState | None:
    """No ISR member is alive in the life it was in sync in, but one has
    restarted: it leads, alone in the ISR, with epoch + 1 (Kafka's "last
    replica standing" comes back). This trusts the node's disk — a replica
    counts as in sync only for data it has fsynced — so a node that lost
    its disk must not rejoin under the same id."""
    isr_nodes = {node for node, _ in state.isr}
    for node in state.replicas:
        if node in isr_nodes and node in live:
            return attrs.evolve(
                state, leader=node, epoch=state.epoch + 1, isr=((node, live[node]),)
            )
    return None
