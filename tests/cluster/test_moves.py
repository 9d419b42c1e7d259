"""Rebalancing moves as data (broky.cluster.moves): unit and state-machine tests."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broky.cluster.moves import changes, next_step, plan_moves, usable_nodes
from broky.cluster.placement import place
from broky.cluster.settings import ClusterSettings
from broky.cluster.state import VbucketState, initial_state

LIVE = {"a": 1, "b": 2, "c": 3, "d": 4}
SIXTEEN = ClusterSettings(vbuckets=16, replication_factor=2)


def test_a_move_adds_waits_hands_over_leadership_then_drops() -> None:
    start = VbucketState(("a", "b"), "a", 5, (("a", 1), ("b", 2)), target=("d", "b"))
    added = next_step(start, LIVE)
    assert added == VbucketState(("a", "b", "d"), "a", 5, (("a", 1), ("b", 2)), target=("d", "b"))
    # d is not in the ISR yet: the move waits for the leader to add it.
    assert next_step(added, LIVE) is None
    caught_up = VbucketState(
        ("a", "b", "d"), "a", 5, (("a", 1), ("b", 2), ("d", 4)), target=("d", "b")
    )
    handed = next_step(caught_up, LIVE)
    assert handed == VbucketState(
        ("a", "b", "d"), "d", 6, (("a", 1), ("b", 2), ("d", 4)), target=("d", "b")
    )
    done = next_step(handed, LIVE)
    assert done == VbucketState(("d", "b"), "d", 6, (("b", 2), ("d", 4)))
    assert next_step(done, LIVE) is None


def test_a_move_waits_for_a_dead_new_replica_and_a_restarted_one() -> None:
    start = VbucketState(("a", "b"), "a", 5, (("a", 1), ("b", 2)), target=("a", "d"))
    assert next_step(start, {"a": 1, "b": 2}) is None
    # d is in the ISR in an ended life: not in sync, so b is not dropped.
    stale = VbucketState(("a", "b", "d"), "a", 5, (("a", 1), ("b", 2), ("d", 3)), ("a", "d"))
    assert next_step(stale, LIVE) is None


def three_node_map(vbuckets: int = 16) -> dict[int, VbucketState]:
    live = {"a": 1, "b": 2, "c": 3}
    placed = place(None, live, vbuckets, 2)
    return {v: initial_state(replicas, live) for v, replicas in enumerate(placed)}


def test_a_joining_node_gets_moves_a_few_at_a_time_and_only_it_gains() -> None:
    states = three_node_map()
    started = plan_moves(states, LIVE, (), SIXTEEN, max_moves=3)
    assert len(started) == 3
    for vbucket, state in started.items():
        assert state.target
        assert set(state.target) - set(states[vbucket].replicas) <= {"d"}
    # With three moving, nothing more starts.
    moving = {**states, **started}
    assert plan_moves(moving, LIVE, (), SIXTEEN, max_moves=3) == {}


def test_a_down_node_keeps_its_replicas_a_removed_one_loses_them() -> None:
    states = three_node_map()
    down = {"a": 1, "b": 2}
    assert usable_nodes(states, down, ()) == {"a", "b", "c"}
    assert plan_moves(states, down, (), SIXTEEN) == {}
    assert changes(states, {"a": 1, "b": 2, "c": 3}, (), SIXTEEN) == {}
    # c removed for good: its replicas move to a and b (both live).
    started = plan_moves(states, down, {"c"}, SIXTEEN, max_moves=16)
    assert started
    assert all("c" not in state.target for state in started.values())
    assert {v for v, s in states.items() if "c" in s.replicas} == set(started)


def test_no_move_leaves_fewer_nodes_than_the_replication_factor() -> None:
    states = three_node_map()
    assert plan_moves(states, {"a": 1, "b": 2}, {"b", "c"}, SIXTEEN) == {}


def test_a_move_towards_a_removed_node_is_planned_again() -> None:
    states = three_node_map()
    vbucket = next(v for v, s in states.items() if "c" not in s.replicas)
    first, second = states[vbucket].replicas
    states[vbucket] = VbucketState(
        (first, second, "d"),
        first,
        1,
        states[vbucket].isr,
        target=("d", second),
    )
    replanned = plan_moves(states, LIVE, {"d"}, SIXTEEN)
    assert "d" not in replanned[vbucket].target
    # The next steps drop d without ever leaving the ISR short.
    state = replanned[vbucket]
    while (step := next_step(state, LIVE)) is not None:
        assert len(step.isr) >= 2
        state = step
    assert "d" not in state.replicas


class Rebalancing(RuleBasedStateMachine):
    """A cluster's vbucket map under joins, removals, crashes and restarts,
    driven by the controller's own function (``changes``), with leaders
    adding caught-up replicas to their ISR and acked publishes making every
    replica outside the ISR stale. The test keeps the truth: which node
    holds every acked record of each vbucket (``fresh``)."""

    VBUCKETS = 8
    RF = 2
    MAX_MOVES = 2

    def __init__(self) -> None:
        super().__init__()
        self.lives = {"n1": 1, "n2": 1, "n3": 1}
        self.live = dict(self.lives)
        self.removed: set[str] = set()
        placed = place(None, self.live, self.VBUCKETS, self.RF)
        self.states = {v: initial_state(r, self.live) for v, r in enumerate(placed)}
        self.fresh = {(node, v) for v, r in enumerate(placed) for node in r}
        self.joined = 3

    def _apply(self) -> None:
        before = dict(self.states)
        layout = ClusterSettings(self.VBUCKETS, self.RF)
        written = changes(self.states, self.live, self.removed, layout, self.MAX_MOVES)
        for vbucket, state in written.items():
            old = before[vbucket]
            state.check()
            # The epoch moves by one exactly when the leader (or its life) does.
            moved = (state.leader, state.leader_epoch_of_node()) != (
                old.leader,
                old.leader_epoch_of_node(),
            )
            assert state.epoch == old.epoch + moved
            if state.leader is not None and moved:
                assert state.leader in {node for node, _ in old.isr}
            if not (set(old.isr) - set(state.isr)) <= {
                entry for entry in old.isr if self.live.get(entry[0]) != entry[1]
            }:
                # A move dropped live ISR members: only ones outside the
                # target, and the whole target stays in sync.
                assert not old.target or set(state.replicas) == set(old.target)
                assert len(state.isr) >= min(len(old.isr), self.RF)
            self.states[vbucket] = state
        assert sum(1 for s in self.states.values() if s.target) <= self.MAX_MOVES
        # A node deletes its copy once it is neither replica nor target
        # (at once here, even if down: the strictest case).
        for node, vbucket in list(self.fresh):
            state = self.states[vbucket]
            if node not in state.replicas and node not in state.target:
                self.fresh.discard((node, vbucket))

    @rule()
    def controller(self) -> None:
        self._apply()

    @precondition(lambda self: self.joined < 6)
    @rule()
    def join(self) -> None:
        self.joined += 1
        node = f"n{self.joined}"
        self.lives[node] = 1
        self.live[node] = 1

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        if self.live:
            node = data.draw(st.sampled_from(sorted(self.live)))
            del self.live[node]

    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        down = sorted(set(self.lives) - set(self.live))
        if down:
            node = data.draw(st.sampled_from(down))
            self.lives[node] += 1
            self.live[node] = self.lives[node]

    @rule(data=st.data())
    def remove_node(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.lives)))
        self.removed.add(node)

    @rule(vbucket=st.integers(0, VBUCKETS - 1), data=st.data())
    def leader_adds_caught_up_replica(self, vbucket: int, data: st.DataObject) -> None:
        state = self.states[vbucket]
        if state.leader is None or self.live.get(state.leader) != state.leader_epoch_of_node():
            return
        members = {node for node, _ in state.isr}
        waiting = sorted(n for n in state.replicas if n not in members and n in self.live)
        if waiting:
            node = data.draw(st.sampled_from(waiting))
            self.fresh.add((node, vbucket))  # it fetched everything first
            self.states[vbucket] = VbucketState(
                state.replicas,
                state.leader,
                state.epoch,
                (*state.isr, (node, self.live[node])),
                state.target,
            )

    @rule(vbucket=st.integers(0, VBUCKETS - 1))
    def acked_publish(self, vbucket: int) -> None:
        """Acked only when every ISR member (in its life) has it: every
        other node's copy is now behind."""
        state = self.states[vbucket]
        if state.leader is None or any(self.live.get(n) != life for n, life in state.isr):
            return
        members = {node for node, _ in state.isr}
        self.fresh = {(n, v) for n, v in self.fresh if v != vbucket or n in members}

    @invariant()
    def every_in_sync_replica_holds_every_acked_record(self) -> None:
        for vbucket, state in self.states.items():
            for node, _ in state.isr:
                assert (node, vbucket) in self.fresh, (node, vbucket, state)

    def teardown(self) -> None:
        """Heal (everyone back: a removed node may hold the only in-sync copy
        of a vbucket, whose move then waits for it), then the map must settle
        balanced without the removed nodes, if enough remain."""
        for node, life in self.lives.items():
            if node not in self.live:
                self.live[node] = life + 1
        for _ in range(200):
            self._apply()
            for vbucket in range(self.VBUCKETS):
                while True:
                    state = self.states[vbucket]
                    members = {node for node, _ in state.isr}
                    waiting = [n for n in state.replicas if n not in members and n in self.live]
                    if state.leader is None or not waiting:
                        break
                    self.fresh.add((waiting[0], vbucket))
                    self.states[vbucket] = VbucketState(
                        state.replicas,
                        state.leader,
                        state.epoch,
                        (*state.isr, (waiting[0], self.live[waiting[0]])),
                        state.target,
                    )
        self.every_in_sync_replica_holds_every_acked_record()
        kept = usable_nodes(self.states, self.live, self.removed)
        if len(kept) < self.RF:
            return
        assert not any(s.target for s in self.states.values())
        copies = Counter(n for s in self.states.values() for n in s.replicas)
        assert not set(copies) & self.removed
        assert max(copies.values()) - min(copies[n] for n in kept) <= 1, copies


TestRebalancing = Rebalancing.TestCase
TestRebalancing.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
