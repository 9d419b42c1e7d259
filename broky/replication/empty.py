"""The ISR of vbuckets that hold no partition: every live replica.

A vbucket's ISR grows only when its leader's partition tasks see a
follower catch up (broky.replication.service). A vbucket none of whose
partitions exist (no topic hashes to it) has no data, so nothing would
ever add a replica back: a restarted follower would stay out of its ISR
for good, and a move (broky.cluster.moves), which waits for the new
replica to be in the ISR, would never end. Here the leader of such a
vbucket adds every live replica to its ISR at once, by the same
compare-and-swap as any ISR change (fenced if it no longer leads).

"No partition" is judged by this node's durable topics: the nodes of a
replicated cluster declare the same ones (a follower fetches a partition
from its leader by name, so a topic only some nodes have is not
replicated anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import trio

from broky.cluster.etcd_wire import EtcdError
from broky.cluster.leadership import Fenced, IsrConflict, change_isr
from broky.cluster.state import StateError
from broky.replication.member import Member

log = logging.getLogger("broky.replication")

#: Longest pause between checks without an etcd change: a node's new life
#: (membership) is not a vbucket change.
CHECK_INTERVAL = 0.25


async def sync_empty_vbuckets(node: Member, with_data: Collection[int]) -> None:
    """Until cancelled: keep the ISR of every vbucket this node leads and
    that is not in ``with_data`` equal to its live replicas."""
    while True:
        await _sync(node, with_data)
        with trio.move_on_after(CHECK_INTERVAL):
            await node.vbuckets.changed()


async def _sync(node: Member, with_data: Collection[int]) -> None:
    live = {member_id: member.epoch for member_id, member in node.membership.members().items()}
    states = node.vbuckets.states()
    for vbucket, term in sorted(node.terms().items()):
        stored = states.get(vbucket)
        if vbucket in with_data or stored is None:
            continue
        state = stored.state
        members = {member for member, _ in state.isr}
        adding = [(n, live[n]) for n in state.replicas if n in live and n not in members]
        if not adding:
            continue
        try:
            await change_isr(node.client, node.keys, term, (*state.isr, *adding))
        except (Fenced, IsrConflict, EtcdError, StateError) as exc:
            log.debug("vbucket %d (no partitions): ISR change failed: %s", vbucket, exc)
        else:
            log.info("vbucket %d (no partitions): %s joined the ISR", vbucket, adding)
