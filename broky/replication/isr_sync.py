"""A leader taking the ISR etcd holds, in revision order.

A partition's leader learns ISR changes two ways: its own compare-and-swap
answers (broky.replication.isr_review) and the vbucket states
its etcd watch delivers (the controller removing a dead follower, a move
adding a replica). The watch lags: after the leader's own change commits at
revision R it may still deliver states older than R. Taking one of those
would undo the leader's change, and when the newer state then came, a
follower it had just added would be refused as lacking the data below the
high watermark (its progress was forgotten when the stale state dropped
it): the leader's ISR stayed smaller than etcd's until that follower lagged
out and was added back. So each leadership remembers the revision of the
ISR it holds, and a state is taken only if it is newer.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import attrs

from broky.cluster.isr import IsrRuleError, LeaderIsr
from broky.cluster.state import IsrEntry, VbucketState


class HoldsIsr(Protocol):
    """A leadership (broky.replication.leading's ``Leading``)."""

    isr: LeaderIsr
    #: The etcd revision of the vbucket state whose ISR ``isr`` holds.
    isr_revision: int


@attrs.frozen
class Taken:
    """What ``take_isr`` did: ``before`` is the ISR it replaced (None:
    nothing changed); ``refused`` why etcd's ISR was not taken."""

    before: tuple[IsrEntry, ...] | None = None
    refused: str | None = None


def take_isr(leading: HoldsIsr, state: VbucketState, revision: int) -> Taken:
    """Take the replica set and ISR of ``state``, stored by etcd at
    ``revision``, unless a change of the leader's own is pending (its
    answer settles the ISR) or ``revision`` is not newer than the ISR held."""
    isr = leading.isr
    if isr.replicas != state.replicas:
        isr.replicas_changed(state.replicas)  # a move added or dropped one
    if isr.pending_isr is not None or revision <= leading.isr_revision:
        return Taken()
    leading.isr_revision = revision
    before = isr.committed_isr
    if set(state.isr) == set(before):
        return Taken()
    try:
        isr.isr_committed(state.isr)
    except IsrRuleError as exc:
        return Taken(refused=str(exc))
    return Taken(before=before)


def took_answer(leaderships: list[HoldsIsr], revision: int) -> None:
    """The leaderships of one vbucket took the answer of a compare-and-swap
    committed at ``revision``: older states from the watch are stale now."""
    for leading in leaderships:
        leading.isr_revision = max(leading.isr_revision, revision)


def live_proposal(
    isr: LeaderIsr, now: float, live: Collection[IsrEntry]
) -> tuple[IsrEntry, ...] | None:
    """``isr.propose`` without lives etcd no longer lists (``live``: each
    member's current life): a follower that died after its last ack looks
    caught up to the ISR rules, and re-adding it would hold the high
    watermark back until it lagged out. None (nothing pending) when no
    change is left."""
    proposal = isr.propose(now)
    if proposal is None:
        return None
    kept = tuple(entry for entry in proposal if entry == isr.leader or entry in live)
    if set(kept) == set(isr.committed_isr):
        isr.isr_failed()
        return None
    return kept
