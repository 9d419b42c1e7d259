"""A vbucket's partitions agree on ISR additions (broky.replication.vbucket_isr)."""

from __future__ import annotations

import pytest

from broky.cluster.isr import Acks, IsrRuleError, IsrSettings, LeaderIsr
from broky.replication.vbucket_isr import agree, release, settle

LEADER = ("L", 1)
NEW = ("N", 4)
EPOCH = 2


def partition(log_end: int) -> LeaderIsr:
    """One partition of the vbucket, led by L with follower F in sync up
    to ``log_end``; N is a replica being added (a move's new replica)."""
    isr = LeaderIsr(
        LEADER, EPOCH, ("L", "F", "N"), [LEADER, ("F", 1)], 0, 0, 0.0, IsrSettings(2, 1.0)
    )
    if log_end:
        isr.appended(log_end, "t", Acks.ALL)
        isr.synced(log_end)
        isr.follower_ack("F", 1, EPOCH, log_end, 0.0)
    assert isr.high_watermark == log_end
    return isr


def idle_proposes_n(
    busy_durable: int,
) -> tuple[LeaderIsr, LeaderIsr, tuple[tuple[str, int], ...]]:
    """A busy partition (HW 100) where N has fsynced ``busy_durable``, and
    an idle one (HW 5) where N caught up and which proposes adding it."""
    busy, idle = partition(100), partition(5)
    idle.follower_ack("N", 4, EPOCH, 5, 0.1)
    busy.follower_ack("N", 4, EPOCH, busy_durable, 0.1)
    proposal = idle.propose(0.1)
    assert proposal is not None
    assert NEW in proposal
    return busy, idle, proposal


def test_a_replica_caught_up_on_one_partition_only_is_not_added() -> None:
    busy, idle, proposal = idle_proposes_n(60)
    assert agree(idle, proposal, [busy]) is None
    assert idle.pending_isr is None
    assert busy.pending_isr is None


def test_an_agreed_addition_holds_every_partitions_high_watermark() -> None:
    busy, idle, proposal = idle_proposes_n(100)
    agreed = agree(idle, proposal, [busy])
    assert agreed == proposal
    # While etcd has not answered, the busy partition's HW waits for N.
    busy.appended(120, "u", Acks.ALL)
    busy.synced(120)
    busy.follower_ack("F", 1, EPOCH, 120, 0.2)
    assert busy.high_watermark == 100
    assert settle([busy], agreed) == [(busy, (LEADER, ("F", 1)))]
    assert NEW in busy.committed_isr
    busy.follower_ack("N", 4, EPOCH, 120, 0.3)
    assert busy.high_watermark == 120


def test_a_failed_proposal_releases_the_hold() -> None:
    busy, idle, proposal = idle_proposes_n(100)
    assert agree(idle, proposal, [busy]) is not None
    assert NEW in busy.maximal_isr()
    with pytest.raises(IsrRuleError):
        busy.hold([NEW])  # one proposal at a time
    release([busy])
    assert busy.maximal_isr() == busy.committed_isr
    assert NEW not in busy.maximal_isr()


def test_a_sibling_with_a_change_of_its_own_pending_refuses_additions() -> None:
    first, second = partition(5), partition(5)
    for isr in (first, second):
        isr.follower_ack("N", 4, EPOCH, 5, 0.1)
    assert second.propose(0.1) is not None  # pending in the second
    proposal = first.propose(0.1)
    assert proposal is not None
    assert agree(first, proposal, [second]) is None
