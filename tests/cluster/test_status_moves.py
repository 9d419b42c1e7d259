"""``broky cluster status`` shows moves in progress and removed nodes (no etcd)."""

from __future__ import annotations

import io

from broky.cluster.etcd_wire import KeyValue
from broky.cluster.settings import ClusterSettings
from broky.cluster.state import VbucketState
from broky.cluster.status import ClusterStatus, render
from broky.cluster.vbuckets import StoredState


def stored(vbucket: int, state: VbucketState) -> StoredState:
    return StoredState(vbucket, state, KeyValue(b"vb/%d" % vbucket, state.to_json(), 1, 1, 1, 0))


def test_status_lists_each_move_and_its_step() -> None:
    catching_up = VbucketState(("a", "b", "d"), "a", 4, (("a", 1), ("b", 2)), target=("d", "b"))
    handing_over = VbucketState(
        ("a", "c", "d"), "a", 2, (("a", 1), ("c", 3), ("d", 4)), target=("c", "d")
    )
    still = VbucketState(("b", "c"), "b", 1, (("b", 2), ("c", 3)))
    status = ClusterStatus(
        revision=9,
        settings=ClusterSettings(vbuckets=3, replication_factor=2),
        controller="a",
        controller_epoch=5,
        members={},
        vbuckets={0: stored(0, catching_up), 1: stored(1, handing_over), 2: stored(2, still)},
        decommissioned=frozenset({"a"}),
    )
    out = io.StringIO()
    render(status, out)
    text = out.getvalue()
    assert "3 vbuckets placed, 0 under-replicated, 0 offline, 2 moving" in text
    assert "removed for good: a" in text
    assert "moving vbucket 0: [a,b,d] -> [d,b] (catching up: d)" in text
    assert "moving vbucket 1: [a,c,d] -> [c,d] (handing over)" in text
    assert "moving vbucket 2" not in text
    fields = status.to_json()
    assert fields["moving"] == [0, 1]
    assert fields["decommissioned"] == ["a"]
    assert fields["vbuckets"]["0"]["target"] == ["d", "b"]
    assert fields["vbuckets"]["2"]["target"] is None
