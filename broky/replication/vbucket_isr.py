"""One ISR per vbucket, agreed on by all of its partitions.

etcd keeps one ISR per vbucket (broky.cluster.state), but a leader tracks
its followers per partition, one ``LeaderIsr`` each, and every partition's
leader task proposes ISR changes. A replica that one partition finds
caught up may still lack acked records of another partition of the same
vbucket; if etcd named it in sync, a failover, or the leader hand-over of a
move (broky.cluster.moves), could elect it and lose those records.

So additions are agreed vbucket-wide, on the leader node (which leads all
of a vbucket's partitions in the same term):

- one proposal per vbucket at a time (``lock``);
- a partition's proposal keeps only the additions that every sibling
  partition has fsynced up to its own high watermark (``agree``);
- the siblings hold those additions as pending (their high watermarks
  wait for them: KIP-497's maximal ISR) until etcd answers, so none acks a
  record the new member lacks before etcd calls it in sync; then every
  sibling takes etcd's answer (``settle``).

Removals need no agreement: a smaller ISR is safe for every partition
once etcd has it (each then stops waiting for the removed replica).
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from broky.cluster.isr import IsrRuleError, LeaderIsr
from broky.cluster.state import IsrEntry


class VbucketLocks:
    """One lock per vbucket with led partitions (at most the cluster's
    vbucket count, a few hundred small objects)."""

    def __init__(self) -> None:
        self._locks: dict[int, trio.Lock] = {}

    def lock(self, vbucket: int) -> trio.Lock:
        return self._locks.setdefault(vbucket, trio.Lock())


def agree(
    isr: LeaderIsr, proposal: tuple[IsrEntry, ...], siblings: Sequence[LeaderIsr]
) -> tuple[IsrEntry, ...] | None:
    """``proposal`` (pending in ``isr``) without the additions a sibling has
    not fsynced up to its high watermark; the rest are held pending in the
    siblings. None (and nothing pending anywhere) if no change is left."""
    additions = [entry for entry in proposal if entry not in isr.committed_isr]
    refused = {
        entry
        for entry in additions
        for sibling in siblings
        if entry not in sibling.committed_isr
        and (
            # A sibling with a change of its own pending cannot hold this one.
            sibling.pending_isr is not None or sibling.durable_of(entry) < sibling.high_watermark
        )
    }
    if refused:
        proposal = tuple(entry for entry in proposal if entry not in refused)
        if set(proposal) == set(isr.committed_isr):
            isr.isr_failed()
            return None
        isr.narrow(proposal)
    kept = [entry for entry in additions if entry not in refused]
    for sibling in siblings:
        sibling.hold(kept)
    return proposal


def release(siblings: Sequence[LeaderIsr]) -> None:
    """The proposal was not committed: the siblings stop holding it."""
    for sibling in siblings:
        sibling.isr_failed()


def settle(
    siblings: Sequence[LeaderIsr], committed: Sequence[IsrEntry]
) -> list[tuple[LeaderIsr, tuple[IsrEntry, ...]]]:
    """etcd committed ``committed``: every sibling takes it. Returns each
    sibling that changed with its ISR before (for events)."""
    changed = []
    for sibling in siblings:
        before = sibling.committed_isr
        try:
            sibling.isr_committed(committed)
        except IsrRuleError:
            sibling.isr_failed()  # it lacks a member's data: it keeps its ISR
            continue
        if set(before) != set(sibling.committed_isr):
            changed.append((sibling, before))
    return changed
