"""Leader-epoch truncation: replicas never diverge, whatever the elections."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broky.cluster.epochs import (
    EpochHistory,
    EpochHistoryError,
    FollowerFence,
    Verdict,
    truncation_step,
)

REPLICAS = ("A", "B", "C")

#: A record: (leader epoch it was written in, unique id).
Record = tuple[int, int]


class Replica:
    def __init__(self) -> None:
        self.log: list[Record] = []
        self.history = EpochHistory()

    def append(self, record: Record) -> None:
        self.history.assign(record[0], len(self.log))
        self.log.append(record)

    def truncate(self, end: int) -> None:
        del self.log[end:]
        self.history.truncate(end)


class Elections(RuleBasedStateMachine):
    """Any replica may be elected at any time (even one that is behind:
    unclean), leaders append, followers fetch partial prefixes. After a
    follower applies the truncation rule and fetches, its log is a prefix of
    the leader's: no divergent record survives."""

    def __init__(self) -> None:
        super().__init__()
        self.replicas = {name: Replica() for name in REPLICAS}
        self.epoch = 0
        self.leader: str | None = None
        self.ids = itertools.count()

    @rule(name=st.sampled_from(REPLICAS))
    def elect(self, name: str) -> None:
        self.epoch += 1
        self.leader = name
        replica = self.replicas[name]
        replica.history.assign(self.epoch, len(replica.log))

    @rule(count=st.integers(1, 4))
    def append(self, count: int) -> None:
        if self.leader is None:
            return
        for _ in range(count):
            self.replicas[self.leader].append((self.epoch, next(self.ids)))

    @rule(name=st.sampled_from(REPLICAS), count=st.integers(0, 5))
    def fetch(self, name: str, count: int) -> None:
        if self.leader is None or name == self.leader:
            return
        leader, follower = self.replicas[self.leader], self.replicas[name]
        agreed = False
        for _ in range(self.epoch + 1):  # each round lowers the latest epoch
            latest = follower.history.latest_epoch
            if latest is None:
                break
            answer = leader.history.end_for(latest, len(leader.log))
            end, agreed = truncation_step(follower.history, len(follower.log), answer)
            follower.truncate(end)
            if agreed:
                break
        assert agreed or follower.history.latest_epoch is None
        # Truncated once, the follower holds a prefix of the leader's log.
        assert follower.log == leader.log[: len(follower.log)]
        for record in leader.log[len(follower.log) : len(follower.log) + count]:
            follower.append(record)

    @invariant()
    def histories_match_the_logs(self) -> None:
        for replica in self.replicas.values():
            starts: dict[int, int] = {}
            for offset, (epoch, _) in enumerate(replica.log):
                starts.setdefault(epoch, offset)
            with_records = {e: s for e, s in replica.history.entries if s < len(replica.log)}
            assert with_records == starts


Elections.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestElections = Elections.TestCase


def test_kip_101_double_failover() -> None:
    """A leads epoch 1 and writes 0..3; B copies 0..1 and leads epoch 2,
    writing 2'; A returns as a follower: it must drop its 2..3."""
    history_a = EpochHistory([(1, 0)])
    history_b = EpochHistory([(1, 0), (2, 2)])
    answer = history_b.end_for(1, 3)
    assert answer == (1, 2)
    assert truncation_step(history_a, 4, answer) == (2, True)


def test_kip_279_unknown_epoch() -> None:
    """The follower's latest epoch (3) is one the leader never had: the
    leader answers for the largest epoch it has below it."""
    leader = EpochHistory([(1, 0), (4, 5)])
    follower = EpochHistory([(1, 0), (3, 4)])
    answer = leader.end_for(3, 9)
    assert answer == (1, 5)
    assert truncation_step(follower, 7, answer) == (4, True)
    assert leader.end_for(0, 9) is None
    assert truncation_step(follower, 7, None) == (0, True)


def test_an_epoch_the_follower_lacks_takes_another_round() -> None:
    """B wrote epoch 1 at 0 and led epoch 3 (empty); C wrote epoch 2 at 0
    and leads epoch 4. B asks for 3, C answers (2, 1): B lacks epoch 2, so it
    cuts to where its epoch 1 ends, asks for 1, and C has nothing: cut to 0."""
    leader = EpochHistory([(2, 0), (4, 1)])
    follower = EpochHistory([(1, 0), (3, 1)])
    answer = leader.end_for(3, 1)
    assert answer == (2, 1)
    assert truncation_step(follower, 1, answer) == (1, False)
    follower.truncate(1)
    assert follower.entries == ((1, 0),)
    assert truncation_step(follower, 1, leader.end_for(1, 1)) == (0, True)


def test_history_refuses_going_back() -> None:
    history = EpochHistory([(1, 0), (3, 5)])
    with pytest.raises(EpochHistoryError, match="after epoch 3"):
        history.assign(2, 9)
    with pytest.raises(EpochHistoryError, match="before epoch 3"):
        history.assign(4, 4)
    history.assign(3, 7)  # known: ignored
    assert history.entries == ((1, 0), (3, 5))
    history.assign(5, 5)  # epoch 3 held nothing: replaced
    assert history.entries == ((1, 0), (5, 5))
    history = EpochHistory([(1, 0), (5, 5)])
    history.truncate(5)
    assert history.entries == ((1, 0),)


def test_follower_fence() -> None:
    fence = FollowerFence()
    assert fence.verdict(3, 0, 0) is Verdict.TRUNCATE_FIRST
    fence.follow(3)
    assert fence.verdict(3, 0, 0) is Verdict.APPEND
    assert fence.verdict(3, 5, 2) is Verdict.OUT_OF_SEQUENCE
    assert fence.verdict(2, 0, 0) is Verdict.FENCED  # a deposed leader still sending
    assert fence.verdict(4, 0, 0) is Verdict.TRUNCATE_FIRST
    with pytest.raises(EpochHistoryError, match="after epoch 3"):
        fence.follow(2)
