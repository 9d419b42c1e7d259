"""ReplicationEvents (counters and advisories) and the replication metric families."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from broky.observability.replication_metrics import (
    MAX_LABELLED_PARTITIONS,
    labelled,
    replication_families,
)
from broky.observability.system import Advisory
from broky.replication.events import (
    PartitionReplication,
    ReplicationEvents,
    ReplicationStatistics,
)

REPLICAS = ("n1", "n2", "n3")


def _recorder() -> tuple[list[tuple[Advisory, dict[str, Any]]], ReplicationEvents]:
    seen: list[tuple[Advisory, dict[str, Any]]] = []
    return seen, ReplicationEvents("n1", lambda kind, payload: seen.append((kind, payload)))


def test_leading_with_a_short_isr_starts_an_episode_and_a_new_leader_reports_its_own() -> None:
    seen, events = _recorder()
    events.led("orders", 2, 5, ["n1", "n3"], REPLICAS)
    assert [kind for kind, _ in seen] == [
        Advisory.CLUSTER_LEADER_CHANGED,
        Advisory.CLUSTER_UNDER_REPLICATED,
    ]
    assert seen[0][1] == {
        "node": "n1",
        "topic": "orders",
        "partition": 2,
        "epoch": 5,
        "leader": "n1",
        "isr": ["n1", "n3"],
        "replicas": list(REPLICAS),
    }
    assert events.under_replicated == {("orders", 2)}
    events.stopped_leading("orders", 2)  # silently: the next leader reports
    assert len(seen) == 2
    assert not events.under_replicated
    events.led("orders", 2, 7, REPLICAS, REPLICAS)
    assert [kind for kind, _ in seen[2:]] == [Advisory.CLUSTER_LEADER_CHANGED]
    assert events.leader_changes == 2


@given(st.lists(st.sets(st.sampled_from(("n2", "n3"))), max_size=12))
def test_counters_and_episodes_follow_the_isr(changes: list[set[str]]) -> None:
    seen, events = _recorder()
    isr = {"n1", "n2", "n3"}
    events.led("orders", 0, 1, isr, REPLICAS)
    removed = added = 0
    for change in changes:
        new = {"n1", *change}
        removed += len(isr - new)
        added += len(new - isr)
        events.isr_changed("orders", 0, 1, isr, new, REPLICAS, "leader")
        isr = new
    assert (events.isr_shrinks, events.isr_expands) == (removed, added)
    kinds = [kind for kind, _ in seen]
    assert kinds.count(Advisory.CLUSTER_ISR_SHRUNK) == sum(
        1
        for before, after in zip([{"n2", "n3"}, *changes], changes, strict=False)
        if before - after
    )
    episodes = [
        kind
        for kind in kinds
        if kind in (Advisory.CLUSTER_UNDER_REPLICATED, Advisory.CLUSTER_FULLY_REPLICATED)
    ]
    # Episodes alternate, start under-replicated, and end where the ISR is.
    assert all(a is not b for a, b in itertools.pairwise(episodes))
    assert not episodes or episodes[0] is Advisory.CLUSTER_UNDER_REPLICATED
    assert (("orders", 0) in events.under_replicated) == (len(isr) < 3)


def _partition(index: int, lag: int) -> PartitionReplication:
    return PartitionReplication(
        "orders", index, "leader", 3, 100, 100 - lag, ("n1",), REPLICAS, (("n2", lag), ("n3", 0))
    )


def test_families_label_only_the_most_lagging_led_partitions() -> None:
    partitions = (
        *(_partition(i, i % 7) for i in range(MAX_LABELLED_PARTITIONS + 20)),
        PartitionReplication("orders", 999, "follower", 3, 50, 40),
    )
    chosen = labelled(partitions)
    assert len(chosen) == MAX_LABELLED_PARTITIONS
    assert all(p.role == "leader" for p in chosen)
    assert [p.max_lag for p in chosen] == sorted((p.max_lag for p in chosen), reverse=True)
    statistics = ReplicationStatistics(partitions, 4, 2, 1)
    samples = [
        SimpleNamespace(worker="0", broker=SimpleNamespace(replication=statistics)),
        SimpleNamespace(worker="1", broker=SimpleNamespace(replication=None)),
    ]
    families = {f.name: f for f in replication_families(samples)}  # type: ignore[arg-type]
    values = {
        (f.name, s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    worker = (("worker", "0"),)
    assert (
        values[
            ("broky_replication_leader_partitions", "broky_replication_leader_partitions", worker)
        ]
        == 120
    )
    assert (
        values[
            (
                "broky_replication_under_replicated_partitions",
                "broky_replication_under_replicated_partitions",
                worker,
            )
        ]
        == 120
    )
    assert (
        values[
            ("broky_replication_leader_changes", "broky_replication_leader_changes_total", worker)
        ]
        == 4
    )
    lag = families["broky_replication_follower_lag_messages"].samples
    assert len(lag) == 2 * MAX_LABELLED_PARTITIONS
    assert max(s.value for s in lag) == 6
    assert all(s.labels["worker"] == "0" for f in families.values() for s in f.samples)
