"""A leader takes etcd's ISR in revision order: a stale state from its
watch never undoes the leader's own committed change."""

from __future__ import annotations

import attrs

from broky.cluster.isr import Acks, IsrSettings, LeaderIsr
from broky.cluster.state import IsrEntry, VbucketState
from broky.replication.isr_sync import Taken, live_proposal, take_isr, took_answer

LEADER: IsrEntry = ("L", 1)
F1: IsrEntry = ("F1", 1)
F2: IsrEntry = ("F2", 1)
REPLICAS = ("L", "F1", "F2")


@attrs.define
class Leading:
    isr: LeaderIsr
    isr_revision: int = 0


def state(*isr: IsrEntry) -> VbucketState:
    return VbucketState(REPLICAS, "L", 3, (LEADER, *isr))


def leading_with(*isr: IsrEntry, revision: int) -> Leading:
    isr_machine = LeaderIsr(LEADER, 3, REPLICAS, (LEADER, *isr), 10, 10, 0.0, IsrSettings())
    return Leading(isr_machine, revision)


def test_a_stale_state_after_the_leaders_own_change_is_ignored() -> None:
    """The leader re-added F2 at revision 12; its watch then delivers the
    state of revision 11 (F2 removed by the controller), then 12 itself."""
    leading = leading_with(F1, revision=10)
    leading.isr.follower_ack("F2", 1, 3, 10, 0.5)  # F2 caught up
    proposal = leading.isr.propose(0.6)
    assert proposal is not None
    assert set(proposal) == {LEADER, F1, F2}
    leading.isr.isr_committed(proposal)  # etcd answered: committed at 12
    took_answer([leading], 12)
    assert take_isr(leading, state(F1), 11) == Taken()
    assert set(leading.isr.committed_isr) == {LEADER, F1, F2}  # not undone
    taken = take_isr(leading, state(F1, F2), 12)
    assert (taken.before, taken.refused) == (None, None)
    assert leading.isr.high_watermark == 10  # F2 still counts with its progress


def test_a_newer_state_is_taken() -> None:
    leading = leading_with(F1, F2, revision=10)
    taken = take_isr(leading, state(F1), 14)  # the controller removed F2
    assert taken.before is not None
    assert set(taken.before) == {LEADER, F1, F2}
    assert set(leading.isr.committed_isr) == {LEADER, F1}
    assert leading.isr_revision == 14
    assert take_isr(leading, state(F1, F2), 13).before is None  # older again: ignored


def test_a_state_that_adds_a_follower_without_its_data_is_refused_once() -> None:
    leading = leading_with(F1, revision=10)
    taken = take_isr(leading, state(F1, F2), 15)
    assert taken.refused is not None
    assert "F2" in taken.refused
    assert set(leading.isr.committed_isr) == {LEADER, F1}
    assert take_isr(leading, state(F1, F2), 15).refused is None  # the same state: no retry


def test_nothing_is_taken_while_the_leaders_own_change_is_pending() -> None:
    leading = leading_with(F1, F2, revision=10)
    leading.isr.appended(11, "token", Acks.ALL)  # F2 never fetches it
    leading.isr.follower_ack("F1", 1, 3, 11, 9.0)
    assert leading.isr.propose(9.0) == (LEADER, F1)  # F2 lagged out: pending
    assert take_isr(leading, state(F1, F2), 20) == Taken()
    assert leading.isr_revision == 10
    assert set(leading.isr.committed_isr) == {LEADER, F1, F2}


def test_a_follower_whose_life_ended_is_not_proposed_back() -> None:
    """F2 acked and then died (etcd lists it in a new life, or not at all):
    the ISR rules see it caught up, but proposing it would hold the HW back."""
    leading = leading_with(F1, revision=10)
    leading.isr.follower_ack("F2", 1, 3, 10, 0.5)
    assert live_proposal(leading.isr, 0.6, {LEADER, F1, ("F2", 2)}) is None
    assert leading.isr.pending_isr is None  # nothing left pending
    proposal = live_proposal(leading.isr, 0.7, {LEADER, F1, F2})
    assert proposal is not None
    assert set(proposal) == {LEADER, F1, F2}
