"""The ISR of vbuckets without partitions (broky.replication.empty), and
that one service per node keeps it: worker 0's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from broky.cluster.leadership import Term
from broky.cluster.state import IsrEntry, VbucketState
from broky.config import Config
from broky.replication import empty
from broky.replication.attach import service_for


def _member(states: dict[int, VbucketState], led: list[int], live: dict[str, int]) -> Any:
    return SimpleNamespace(
        client=None,
        keys=None,
        membership=SimpleNamespace(
            members=lambda: {node: SimpleNamespace(epoch=epoch) for node, epoch in live.items()}
        ),
        vbuckets=SimpleNamespace(
            states=lambda: {v: SimpleNamespace(state=s) for v, s in states.items()}
        ),
        terms=lambda: {v: Term(v, states[v].epoch, "A", 1) for v in led},
    )


async def test_a_led_empty_vbucket_takes_every_live_replica_into_its_isr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    changes: list[tuple[int, tuple[IsrEntry, ...]]] = []

    async def change_isr(
        client: object, keys: object, term: Term, isr: tuple[IsrEntry, ...]
    ) -> None:
        changes.append((term.vbucket, isr))

    monkeypatch.setattr(empty, "change_isr", change_isr)
    states = {
        0: VbucketState(("A", "B", "C"), "A", 4, (("A", 1),)),  # empty, led: B and C join
        1: VbucketState(("A", "B", "C"), "A", 2, (("A", 1),)),  # holds data: left to its partitions
        2: VbucketState(("B", "A", "C"), "B", 3, (("B", 1),)),  # led by B: not ours
        3: VbucketState(("A", "B", "D"), "A", 5, (("A", 1), ("B", 2))),  # D is not live
    }
    member = _member(states, [0, 1, 3], {"A": 1, "B": 2, "C": 7})
    await empty._sync(member, with_data={1})
    assert changes == [(0, (("A", 1), ("B", 2), ("C", 7)))]


def _broker() -> Any:
    return SimpleNamespace(
        store=SimpleNamespace(),
        observability=SimpleNamespace(system=SimpleNamespace(advise=None)),
        replication_statistics=None,
    )


def test_only_worker_0_of_a_node_keeps_the_empty_vbuckets_isr() -> None:
    """A second worker's compare-and-swaps would all lose to the first's."""
    config = Config()
    member: Any = SimpleNamespace(node_id="A")
    assert service_for(_broker(), config, member, "127.0.0.1:9000").empty_vbuckets
    assert service_for(_broker(), config, member, "127.0.0.1:9000", 0).empty_vbuckets
    assert not service_for(_broker(), config, member, "127.0.0.1:9001", 1).empty_vbuckets
