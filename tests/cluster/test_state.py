"""The vbucket state rules, as data (no etcd)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.cluster.state import StateError, VbucketState, after_membership, initial_state

LIVE = {"a": 10, "b": 11, "c": 12}


def state(leader: str | None, epoch: int, isr: str, replicas: str = "abc") -> VbucketState:
    return VbucketState(tuple(replicas), leader, epoch, tuple((n, LIVE[n]) for n in isr))


def test_initial_state_is_led_by_the_preferred_replica() -> None:
    assert initial_state(["b", "c", "a"], LIVE) == VbucketState(
        ("b", "c", "a"), "b", 1, (("b", 11), ("c", 12), ("a", 10))
    )


def test_nothing_changes_while_everyone_lives() -> None:
    assert after_membership(state("a", 3, "abc"), LIVE) is None


def test_a_dead_follower_leaves_the_isr_without_an_election() -> None:
    live = {"a": 10, "c": 12}
    assert after_membership(state("a", 3, "abc"), live) == state("a", 3, "ac")


def test_a_dead_leader_is_replaced_from_the_isr_with_the_next_epoch() -> None:
    live = {"b": 11, "c": 12}
    assert after_membership(state("a", 3, "abc"), live) == state("b", 4, "bc")
    # b alive but out of sync: c is chosen even though b comes first.
    assert after_membership(state("a", 3, "ac"), live) == state("c", 4, "c")


def test_a_restarted_node_counts_as_gone() -> None:
    restarted = {**LIVE, "a": 99}
    assert after_membership(state("a", 3, "abc"), restarted) == state("b", 4, "bc")
    assert after_membership(state("b", 3, "abc"), restarted) == state("b", 3, "bc")


def test_a_restarted_last_in_sync_replica_leads_again() -> None:
    restarted = {"a": 99, "b": 11}
    expected = VbucketState(("a", "b", "c"), "a", 4, (("a", 99),))
    assert after_membership(state("c", 3, "ca"), restarted) == expected


def test_no_live_in_sync_replica_means_offline_until_one_returns() -> None:
    offline = after_membership(state("a", 3, "a"), {"b": 11, "c": 12})
    assert offline == state(None, 4, "a")
    assert after_membership(offline, {"b": 11, "c": 12}) is None
    back = after_membership(offline, {"a": 50, "b": 11})
    assert back == VbucketState(("a", "b", "c"), "a", 5, (("a", 50),))


def test_json_round_trip_and_refusals() -> None:
    original = state("b", 7, "bc")
    assert VbucketState.from_json(original.to_json()) == original
    offline = state(None, 2, "a")
    assert VbucketState.from_json(offline.to_json()) == offline
    for junk in (
        b"nope",
        b"[]",
        b'{"replicas": ["a"], "leader": "a", "epoch": 1}',
        b'{"replicas": ["a", "a"], "leader": "a", "epoch": 1, "isr": [["a", 1]]}',
        b'{"replicas": ["a"], "leader": "b", "epoch": 1, "isr": [["a", 1]]}',
        b'{"replicas": ["a"], "leader": "a", "epoch": 1, "isr": [["a", 1], ["z", 1]]}',
        b'{"replicas": ["a"], "leader": "a", "epoch": -1, "isr": [["a", 1]]}',
    ):
        with pytest.raises(StateError):
            VbucketState.from_json(junk)


nodes = st.sampled_from("abcde")


@st.composite
def states(draw: st.DrawFn) -> tuple[VbucketState, dict[str, int]]:
    replicas = draw(st.lists(nodes, min_size=1, max_size=4, unique=True))
    isr_nodes = draw(st.lists(st.sampled_from(replicas), unique=True))
    epochs = {node: draw(st.integers(1, 3)) for node in "abcde"}
    isr = tuple((node, epochs[node]) for node in isr_nodes)
    offline: bool = draw(st.booleans())
    leader = None if offline or not isr_nodes else draw(st.sampled_from(isr_nodes))
    live = {node: draw(st.integers(1, 3)) for node in draw(st.lists(nodes, unique=True))}
    return VbucketState(tuple(replicas), leader, draw(st.integers(0, 5)), isr), live


@settings(max_examples=300, deadline=None)
@given(states())
def test_every_transition_keeps_the_invariants(case: tuple[VbucketState, dict[str, int]]) -> None:
    old, live = case
    new = after_membership(old, live)
    if new is None:
        return
    new.check()
    assert new.replicas == old.replicas
    # The epoch moves exactly when the leader (or its life) does, by one.
    term_changed = (new.leader, new.leader_epoch_of_node()) != (
        old.leader,
        old.leader_epoch_of_node(),
    )
    assert new.epoch == old.epoch + term_changed
    if new.leader is not None:
        # Only a live node leads, in its current life, and it was in sync.
        assert new.leader_epoch_of_node() == live[new.leader]
        assert new.leader in {node for node, _ in old.isr}
    # Every remaining ISR member is alive in the life it was in sync with,
    # except the kept ISR of an offline vbucket, all of whose nodes are gone.
    if new.leader is not None:
        assert all(live.get(node) == node_epoch for node, node_epoch in new.isr)
    else:
        assert new.isr == old.isr
        assert not {node for node, _ in new.isr} & set(live)
    # Applying the rules again to the result changes nothing more.
    assert after_membership(new, live) is None
