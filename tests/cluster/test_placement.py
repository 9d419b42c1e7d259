"""The vbucket balancer: distinct replicas, balanced load, little movement."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.cluster.placement import VbucketMap, moved, place, vbucket_of

node_names = st.lists(
    st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True), min_size=1, max_size=9, unique=True
)
vbucket_counts = st.sampled_from([1, 3, 16, 64, 256])
factors = st.integers(min_value=1, max_value=4)


def check_map(placement: VbucketMap, nodes: list[str], vbuckets: int, factor: int) -> None:
    """Replicas distinct and live, the right count, load and leaders balanced."""
    width = min(factor, len(nodes))
    assert len(placement) == vbuckets
    for replicas in placement:
        assert len(replicas) == width
        assert len(set(replicas)) == width
        assert set(replicas) <= set(nodes)
    load = Counter(dict.fromkeys(nodes, 0))
    load.update(node for replicas in placement for node in replicas)
    assert max(load.values()) - min(load.values()) <= 1, load
    leads = Counter(dict.fromkeys(nodes, 0))
    leads.update(replicas[0] for replicas in placement)
    # Leaders move by reordering a replica set only, which cannot always
    # reach ±1 (a node may share no vbucket with the least-leading one).
    assert max(leads.values()) - min(leads.values()) <= 2, leads


@settings(max_examples=100, deadline=None)
@given(node_names, vbucket_counts, factors)
def test_a_new_map_is_valid_and_deterministic(nodes: list[str], vbuckets: int, factor: int) -> None:
    placement = place(None, nodes, vbuckets, factor)
    check_map(placement, nodes, vbuckets, factor)
    assert place(None, list(reversed(nodes)), vbuckets, factor) == placement
    # Re-placing a valid map on the same nodes changes nothing.
    assert place(placement, nodes, vbuckets, factor) == placement


@settings(max_examples=100, deadline=None)
@given(node_names, vbucket_counts, factors, st.data())
def test_joins_and_leaves_move_little(
    nodes: list[str], vbuckets: int, factor: int, data: st.DataObject
) -> None:
    placement = place(None, nodes, vbuckets, factor)
    live = list(nodes)
    for step in range(4):
        if len(live) > 1 and data.draw(st.booleans(), label=f"leave at step {step}"):
            gone = data.draw(st.sampled_from(live))
            live.remove(gone)
            after = place(placement, live, vbuckets, factor)
            held = sum(gone in replicas for replicas in placement)
            if len(live) >= factor:
                # The leaver's copies are re-made; a copy cannot go to a node
                # holding that vbucket already, which can leave counts uneven
                # by a few, evened out by at most `factor` more moves.
                assert moved(placement, after) <= held + factor
        else:
            joined = f"J{step}"  # the strategy makes lowercase names only
            live.append(joined)
            after = place(placement, live, vbuckets, factor)
            if len(live) > factor:
                # Only the joiner gains replicas, and no more than its share.
                gained = {
                    node
                    for old, new in zip(placement, after, strict=True)
                    for node in set(new) - set(old)
                }
                assert gained <= {joined}
                share = math.ceil(vbuckets * factor / len(live))
                assert moved(placement, after) <= share
        check_map(after, live, vbuckets, factor)
        placement = after


def test_a_lower_replication_factor_only_drops_copies() -> None:
    nodes = ["a", "b", "c", "d"]
    three = place(None, nodes, 64, 3)
    two = place(three, nodes, 64, 2)
    check_map(two, nodes, 64, 2)
    assert moved(three, two) == 0


def test_no_nodes_means_no_replicas() -> None:
    assert place(None, [], 4, 3) == [(), (), (), ()]


def test_vbucket_of_spreads_a_topics_partitions() -> None:
    first = vbucket_of("orders", 0, 256)
    assert [vbucket_of("orders", p, 256) for p in range(4)] == [(first + p) % 256 for p in range(4)]
    assert vbucket_of("orders", 0, 256) == vbucket_of("orders", 256, 256)


@pytest.mark.parametrize(("vbuckets", "factor"), [(0, 1), (1, 0)])
def test_bad_sizes_are_refused(vbuckets: int, factor: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        place(None, ["a"], vbuckets, factor)
