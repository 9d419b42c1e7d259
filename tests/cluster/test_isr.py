"""The leader's ISR / high-watermark machine: hypothesis stateful tests."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broky.cluster.isr import Acks, IsrRuleError, IsrSettings, LeaderIsr, Outcome

LEADER = ("L", 1)
FOLLOWERS = ("F1", "F2")
EPOCH = 7
LAG_MAX = 1.0


class LeaderModel(RuleBasedStateMachine):
    """A leader and two followers; the test keeps the truth (what each
    replica has really fsynced, in which life) and checks the machine's
    promises against it after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.lives = {"F1": 1, "F2": 1}
        self.durable = {"F1": 0, "F2": 0}  # the followers' truth
        #: What each ended life had fsynced when it ended.
        self.ended: dict[tuple[str, int], int] = {}
        self.log_end = 0
        self.isr = LeaderIsr(
            LEADER,
            EPOCH,
            ("L", *FOLLOWERS),
            [LEADER, ("F1", 1), ("F2", 1)],
            0,
            0,
            self.now,
            IsrSettings(min_insync=2, replica_lag_max=LAG_MAX),
        )
        self.last_hw = 0
        self.tokens = 0
        self.answered: set[int] = set()
        self.published: dict[int, tuple[int, Acks]] = {}

    def _check_answers(self) -> None:
        for answer in self.isr.answers():
            token = answer.token
            assert isinstance(token, int)
            assert token not in self.answered
            self.answered.add(token)
            end, acks = self.published[token]
            if answer.outcome is Outcome.ACKED:
                if acks is Acks.ALL:
                    # Durable on every member of the committed ISR, and there
                    # are at least min_insync of them.
                    assert len(self.isr.committed_isr) >= 2
                    for node, life in self.isr.committed_isr:
                        if node != "L":
                            had = self.durable[node] if self.lives[node] == life else 0
                            assert max(had, self.ended.get((node, life), 0)) >= end
                assert self.isr.leader_durable >= end

    @rule(count=st.integers(1, 5), acks=st.sampled_from(Acks))
    def publish(self, count: int, acks: Acks) -> None:
        refused = self.isr.check_publish(acks)
        if refused is not None:
            assert refused is Outcome.NOT_ENOUGH_REPLICAS
            assert len(self.isr.committed_isr) < 2
            return
        self.log_end += count
        self.tokens += 1
        self.published[self.tokens] = (self.log_end, acks)
        self.isr.appended(self.log_end, self.tokens, acks)

    @rule()
    def leader_sync(self) -> None:
        self.isr.synced(self.log_end)
        self._check_answers()

    @rule(node=st.sampled_from(FOLLOWERS), count=st.integers(0, 6))
    def follower_fetch(self, node: str, count: int) -> None:
        self.durable[node] = min(self.log_end, self.durable[node] + count)
        self.isr.follower_ack(node, self.lives[node], EPOCH, self.durable[node], self.now)
        self._check_answers()

    @rule(node=st.sampled_from(FOLLOWERS), offset=st.integers(0, 100), epoch=st.integers(0, 9))
    def stale_ack(self, node: str, offset: int, epoch: int) -> None:
        """An ack of another leader epoch, or of a past life, changes nothing."""
        hw, isr = self.isr.high_watermark, self.isr.committed_isr
        if epoch != EPOCH:
            self.isr.follower_ack(node, self.lives[node], epoch, offset, self.now)
        else:
            self.isr.follower_ack("nobody", 1, EPOCH, offset, self.now)
        assert (self.isr.high_watermark, self.isr.committed_isr) == (hw, isr)

    @precondition(lambda self: max(self.lives.values()) > 1)
    @rule(node=st.sampled_from(FOLLOWERS), offset=st.integers(0, 100))
    def old_life_ack(self, node: str, offset: int) -> None:
        """A late ack from a life that has ended changes nothing."""
        if self.lives[node] == 1:
            return
        hw, isr = self.isr.high_watermark, self.isr.committed_isr
        self.isr.follower_ack(node, self.lives[node] - 1, EPOCH, offset, self.now)
        assert (self.isr.high_watermark, self.isr.committed_isr) == (hw, isr)

    @rule(node=st.sampled_from(FOLLOWERS))
    def restart(self, node: str) -> None:
        """A follower restarts as a new life; its disk is empty (worst case),
        so nothing of the new life counts until it has fetched again."""
        self.ended[(node, self.lives[node])] = self.durable[node]
        self.lives[node] += 1
        self.durable[node] = 0
        self.isr.follower_ack(node, self.lives[node], EPOCH, 0, self.now)
        self._check_answers()

    @rule(seconds=st.floats(0.0, 2.0))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.isr.pending_isr is None)
    @rule()
    def propose(self) -> None:
        # ``steady``, the leader's lock-free look first, agrees with it.
        steady = self.isr.steady(self.now)
        proposal = self.isr.propose(self.now)
        assert steady == (proposal is None)
        if proposal is not None:
            assert LEADER in proposal
            assert len({node for node, _ in proposal}) == len(proposal)

    @precondition(lambda self: self.isr.pending_isr is not None)
    @rule(succeed=st.booleans())
    def etcd_answers(self, succeed: bool) -> None:
        pending = self.isr.pending_isr
        assert pending is not None
        assert self.isr.steady(self.now), "nothing more is proposed while one change is out"
        if succeed:
            self.isr.isr_committed(pending)
        else:
            self.isr.isr_failed()
        self._check_answers()

    @invariant()
    def high_watermark_is_safe_and_monotone(self) -> None:
        hw = self.isr.high_watermark
        assert hw >= self.last_hw
        self.last_hw = hw
        assert hw <= self.isr.leader_durable <= self.log_end
        for node, life in self.isr.committed_isr:
            if node != "L":
                # Below the HW: fsynced by this life, or by the life the
                # entry names before it ended (a lost disk is a lost replica).
                had = self.durable[node] if self.lives[node] == life else 0
                assert max(had, self.ended.get((node, life), 0)) >= hw

    @invariant()
    def leader_always_in_sync(self) -> None:
        assert LEADER in self.isr.committed_isr


LeaderModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLeaderModel = LeaderModel.TestCase


def make(min_insync: int = 2) -> LeaderIsr:
    return LeaderIsr(
        LEADER,
        EPOCH,
        ("L", "F1", "F2"),
        [LEADER, ("F1", 1), ("F2", 1)],
        0,
        0,
        0.0,
        IsrSettings(min_insync=min_insync, replica_lag_max=LAG_MAX),
    )


def test_acks_all_waits_for_every_isr_member() -> None:
    isr = make()
    isr.appended(3, "p", Acks.ALL)
    isr.synced(3)
    isr.follower_ack("F1", 1, EPOCH, 3, 0.1)
    assert isr.answers() == []  # F2 has nothing yet
    isr.follower_ack("F2", 1, EPOCH, 3, 0.2)
    assert [(a.token, a.outcome) for a in isr.answers()] == [("p", Outcome.ACKED)]
    assert isr.high_watermark == 3


def test_a_lagging_follower_is_dropped_only_once_etcd_commits_it() -> None:
    isr = make()
    isr.appended(3, "p", Acks.ALL)
    isr.synced(3)
    isr.follower_ack("F1", 1, EPOCH, 3, 0.1)
    assert isr.propose(0.5) is None  # F2 not late yet
    proposal = isr.propose(1.5)
    assert proposal == (LEADER, ("F1", 1))
    # Until etcd commits it, F2 still holds the HW back (KIP-497).
    assert isr.high_watermark == 0
    assert isr.answers() == []
    isr.isr_committed(proposal)
    assert isr.high_watermark == 3
    assert [a.outcome for a in isr.answers()] == [Outcome.ACKED]


def test_a_caught_up_follower_comes_back_at_once() -> None:
    isr = make()
    isr.isr_committed([LEADER, ("F1", 1)])
    isr.appended(4, "p", Acks.ALL)
    isr.synced(4)
    isr.follower_ack("F1", 1, EPOCH, 4, 0.1)
    assert isr.high_watermark == 4
    isr.follower_ack("F2", 1, EPOCH, 4, 0.2)
    assert isr.propose(0.2) == (LEADER, ("F1", 1), ("F2", 1))


def test_below_min_insync_publishes_are_refused_or_answered_after_append() -> None:
    isr = make()
    isr.appended(2, "before", Acks.ALL)
    isr.synced(2)
    isr.isr_committed([LEADER, ("F1", 1)])
    isr.follower_ack("F1", 1, EPOCH, 2, 0.1)
    assert isr.answers()[0].outcome is Outcome.ACKED
    isr.appended(4, "after", Acks.ALL)
    isr.synced(4)
    isr.isr_committed([LEADER])
    assert [a.outcome for a in isr.answers()] == [Outcome.NOT_ENOUGH_REPLICAS_AFTER_APPEND]
    assert isr.check_publish(Acks.ALL) is Outcome.NOT_ENOUGH_REPLICAS
    assert isr.check_publish(Acks.LEADER) is None


def test_contract_violations_are_refused() -> None:
    isr = make()
    with pytest.raises(IsrRuleError, match="lacks the leader"):
        isr.isr_committed([("F1", 1)])
    isr.appended(3, "p", Acks.LEADER)
    with pytest.raises(IsrRuleError, match="went back"):
        isr.appended(2, "q", Acks.LEADER)
    with pytest.raises(IsrRuleError, match="synced"):
        isr.synced(5)
    isr.synced(3)
    isr.isr_committed([LEADER])
    with pytest.raises(IsrRuleError, match="without the data"):
        isr.isr_committed([LEADER, ("F2", 1)])


def test_follower_lags_count_from_each_nodes_newest_life() -> None:
    isr = make()
    isr.appended(10, "a", Acks.ALL)
    isr.synced(10)
    assert isr.follower_lags() == {"F1": 10, "F2": 10}
    isr.follower_ack("F1", 1, EPOCH, 7, 1.0)
    isr.follower_ack("F2", 2, EPOCH, 3, 1.0)  # a new life: counted from what it says
    isr.follower_ack("F2", 1, EPOCH, 9, 1.0)  # the ended life's late ack is ignored
    assert isr.follower_lags() == {"F1": 3, "F2": 7}


def test_a_late_ack_of_a_forgotten_life_does_not_rejoin_the_isr() -> None:
    """Found by the state machine: F1 restarts (life 2), lags and is dropped
    from the ISR (its follower forgotten); a late ack of life 1 then came in
    as a new life holding offset 1 and rejoined the ISR, counting a life
    that had fsynced nothing. The newest life of a node is kept after its
    follower is forgotten, so that ack is ignored."""
    model = LeaderModel()
    model.restart(node="F1")
    model.propose()
    model.time_passes(seconds=2.0)
    model.publish(acks=Acks.ALL, count=1)
    model.leader_sync()
    model.etcd_answers(succeed=True)
    model.propose()
    model.etcd_answers(succeed=True)
    assert model.isr.committed_isr == (("L", 1),)
    model.old_life_ack(node="F1", offset=1)
    model.propose()
    assert model.isr.pending_isr is None  # nothing to add: the ack was ignored
    model.high_watermark_is_safe_and_monotone()
