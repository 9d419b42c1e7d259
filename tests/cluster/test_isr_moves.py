"""The leader's ISR machine when a move changes the replica set (rule 5)."""

from __future__ import annotations

from broky.cluster.isr import Acks, IsrSettings, LeaderIsr

LEADER = ("L", 1)
EPOCH = 3


def leader_with_one_follower() -> LeaderIsr:
    isr = LeaderIsr(LEADER, EPOCH, ("L", "F"), [LEADER, ("F", 1)], 0, 0, 0.0, IsrSettings(2, 1.0))
    isr.appended(10, "t", Acks.ALL)
    isr.synced(10)
    isr.follower_ack("F", 1, EPOCH, 10, 0.1)
    assert isr.high_watermark == 10
    return isr


def test_a_new_replica_counts_once_it_is_in_the_replica_set_and_caught_up() -> None:
    isr = leader_with_one_follower()
    isr.follower_ack("N", 7, EPOCH, 10, 0.2)  # not a replica yet: ignored
    assert isr.propose(0.2) is None
    isr.replicas_changed(("L", "F", "N"))
    isr.follower_ack("N", 7, EPOCH, 4, 0.3)
    assert isr.propose(0.3) is None  # behind the HW: not added
    assert isr.high_watermark == 10  # and it never held the HW back
    isr.follower_ack("N", 7, EPOCH, 10, 0.4)
    proposal = isr.propose(0.4)
    assert proposal is not None
    assert set(proposal) == {LEADER, ("F", 1), ("N", 7)}
    isr.isr_committed(proposal)
    assert isr.high_watermark == 10


def test_a_dropped_replica_placed_again_starts_from_nothing() -> None:
    """Its copy was deleted when the move dropped it: what it held before
    must not make it count as caught up when it comes back."""
    isr = leader_with_one_follower()
    isr.replicas_changed(("L", "F", "N"))
    isr.follower_ack("N", 7, EPOCH, 10, 0.2)
    proposal = isr.propose(0.2)
    assert proposal is not None
    isr.isr_committed(proposal)
    # The move ends: N is dropped (the controller's write, seen by the leader).
    isr.isr_committed([LEADER, ("F", 1)])
    isr.replicas_changed(("L", "F"))
    isr.follower_ack("N", 7, EPOCH, 10, 0.3)  # a late ack: not a replica
    # Placed again, same life, its copy deleted: it reports 0.
    isr.replicas_changed(("L", "F", "N"))
    isr.follower_ack("N", 7, EPOCH, 0, 0.4)
    assert isr.propose(0.4) is None
    assert isr.follower_lags()["N"] == 10


def test_an_isr_member_dropped_by_a_move_is_not_proposed_again() -> None:
    isr = leader_with_one_follower()
    isr.replicas_changed(("L",))
    isr.isr_committed([LEADER])
    isr.follower_ack("F", 1, EPOCH, 10, 0.2)
    assert isr.propose(0.2) is None
    assert isr.maximal_isr() == (LEADER,)


def test_a_replica_outside_the_isr_is_taken_at_its_word_even_going_back() -> None:
    """The leader may miss a quick drop-and-place-again (it reads etcd's
    state from time to time): a replica outside the ISR that reports less
    than before lost its copy, and must fetch it again before it counts."""
    isr = leader_with_one_follower()
    isr.replicas_changed(("L", "F", "N"))
    isr.follower_ack("N", 7, EPOCH, 10, 0.2)
    assert isr.propose(0.2) is not None
    isr.isr_failed()  # the CAS lost a race: N is still outside the ISR
    isr.follower_ack("N", 7, EPOCH, 0, 0.3)
    assert isr.propose(0.3) is None
    isr.follower_ack("F", 1, EPOCH, 0, 0.3)  # an ISR member's late ack
    assert isr.high_watermark == 10
