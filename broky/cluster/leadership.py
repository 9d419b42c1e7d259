"""What a vbucket leader may do, checked against etcd: the fencing side.

A leader acts for one ``(vbucket, epoch)``. Before it trusts its role for
something irreversible it can ask etcd (``check_leader``), and it changes
its ISR only by a compare-and-swap that fails once the controller has
elected someone else (``change_isr``): a leader paused past its lease, or
cut off from etcd, learns here that it was deposed, as Fenced.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import Compare, Get, Put
from broky.cluster.keys import ClusterKeys
from broky.cluster.state import IsrEntry, VbucketState
from broky.cluster.vbuckets import StoredState, states_of

#: CAS attempts for an ISR change racing other writers (the controller
#: removing a dead follower) before giving up; each race means the state
#: changed, which is rare and quickly settled.
ISR_ATTEMPTS = 5


class Fenced(Exception):
    """This node no longer leads the vbucket at the epoch it acted for.

    ``state`` is what etcd holds now (None if the key is gone)."""

    def __init__(self, vbucket: int, epoch: int, state: VbucketState | None) -> None:
        now = "no state" if state is None else f"leader {state.leader} epoch {state.epoch}"
        super().__init__(f"vbucket {vbucket}: fenced at epoch {epoch}, etcd has {now}")
        self.vbucket = vbucket
        self.epoch = epoch
        self.state = state


class IsrConflict(Exception):
    """An ISR change kept losing compare-and-swap races; retry later."""


@attrs.frozen
class Term:
    """A leadership: ``node`` (in its life ``node_epoch``) leads ``vbucket``
    at leader epoch ``epoch``."""

    vbucket: int
    epoch: int
    node: str
    node_epoch: int

    def holds(self, state: VbucketState | None) -> bool:
        return (
            state is not None
            and state.epoch == self.epoch
            and state.leader == self.node
            and state.leader_epoch_of_node() == self.node_epoch
        )


async def _read(client: EtcdClient, keys: ClusterKeys, vbucket: int) -> StoredState | None:
    found = await client.get(keys.vbucket(vbucket))
    return states_of(keys, {kv.key: kv for kv in found.kvs}).get(vbucket)


async def check_leader(client: EtcdClient, keys: ClusterKeys, term: Term) -> StoredState:
    """The vbucket's state if ``term`` still holds (a linearizable read), else Fenced."""
    stored = await _read(client, keys, term.vbucket)
    if stored is None or not term.holds(stored.state):
        raise Fenced(term.vbucket, term.epoch, None if stored is None else stored.state)
    return stored


async def change_isr(
    client: EtcdClient, keys: ClusterKeys, term: Term, isr: Sequence[IsrEntry]
) -> VbucketState:
    """Set the ISR as the leader of ``term``; Fenced if it no longer leads.

    The new ISR must keep the leader and stay within the replicas (else
    StateError); it is committed only if no one changed the key since it
    was read."""
    state, _ = await change_isr_at(client, keys, term, isr)
    return state


async def change_isr_at(
    client: EtcdClient, keys: ClusterKeys, term: Term, isr: Sequence[IsrEntry]
) -> tuple[VbucketState, int]:
    """``change_isr``, also returning the etcd revision that committed it:
    a leader's watch may still deliver older states of the key after the
    answer, and must not take them over this one."""
    key = keys.vbucket(term.vbucket)
    for _ in range(ISR_ATTEMPTS):
        stored = await check_leader(client, keys, term)
        state = attrs.evolve(stored.state, isr=tuple(isr))
        state.check()
        result = await client.txn(
            [Compare.modified(key, stored.kv.mod_revision)], [Put(key, state.to_json())], [Get(key)]
        )
        if result.succeeded:
            return state, result.revision
    raise IsrConflict(
        f"vbucket {term.vbucket}: the ISR change lost {ISR_ATTEMPTS} races with other writers"
    )
