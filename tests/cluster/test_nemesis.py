"""Fault cycles against the metadata layer, with a history checker.

Three in-process nodes on a real etcd. A seeded nemesis runs 20 cycles,
each one fault on a random node — a crash (its lease is left to expire),
a lease killed under it (it rejoins as a new life), a clean stop — and
brings stopped nodes back. A watcher records every version of every
vbucket key from the start. The checker then asserts, over the whole
history, what leader election must never break:

- an epoch has one leader: no two versions share (vbucket, epoch) with
  different leaders;
- epochs never go back, and move by exactly one when the leader changes;
- a new leader was in the previous ISR (no unclean election);
- every version is a valid state (leader in ISR, ISR within replicas);

and after each fault, that etcd reaches a state consistent with the live
members (no dead life leads or is in an ISR, every vbucket with a live ISR
member has a leader) within a bound; it reports how long each took.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from functools import partial

import attrs
import pytest
import trio

from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import EventType, prefix_end
from broky.cluster.keys import ClusterKeys
from broky.cluster.membership import NodeInfo
from broky.cluster.node import ClusterNode
from broky.cluster.settings import ClusterSettings
from broky.cluster.state import VbucketState
from broky.cluster.status import ClusterStatus, read_status
from tests.conftest import eventually

SETTINGS = ClusterSettings(vbuckets=8, replication_factor=3)
NAMES = ("n1", "n2", "n3")
CYCLES = 20
#: Longest a fault may take to be reflected in etcd: a 1 s lease, the
#: controller's reaction, and a loaded CI machine.
SETTLE_BOUND = 10.0


@attrs.define
class Running:
    node: ClusterNode
    scope: trio.CancelScope
    stopped: trio.Event


class Cluster:
    def __init__(self, etcd_url: str, keys: ClusterKeys, nursery: trio.Nursery) -> None:
        self.etcd_url = etcd_url
        self.keys = keys
        self.nursery = nursery
        self.running: dict[str, Running] = {}

    async def start(self, name: str) -> None:
        """Start node ``name`` and wait until it has registered."""
        self.nursery.start_soon(self._run, name)
        await eventually(lambda: name in self.running and self.running[name].node.lives > 0)

    async def _run(self, name: str) -> None:
        stopped = trio.Event()
        async with EtcdClient.from_url(self.etcd_url) as client:
            node = ClusterNode(
                client, self.keys, NodeInfo(name), SETTINGS, lease_ttl=1, register_wait=5
            )
            with trio.CancelScope() as scope:
                self.running[name] = Running(node, scope, stopped)
                try:
                    await node.run()
                finally:
                    stopped.set()

    async def stop(self, name: str, *, crash: bool) -> None:
        running = self.running.pop(name)
        running.node.revoke_on_exit = not crash
        running.scope.cancel()
        await running.stopped.wait()


def consistent(status: ClusterStatus) -> bool:
    """etcd agrees with the live members: nothing led by or in sync on a
    dead life, and every vbucket with a live ISR member has a leader."""
    if len(status.vbuckets) != SETTINGS.vbuckets:
        return False
    lives = {node: member.epoch for node, member in status.members.items()}
    for stored in status.vbuckets.values():
        state = stored.state
        if state.leader is None:
            if any(node in lives for node, _ in state.isr):
                return False
            continue
        if any(lives.get(node) != life for node, life in state.isr):
            return False
    return True


def check_history(history: dict[int, list[VbucketState]]) -> None:
    leaders: dict[tuple[int, int], str | None] = {}
    for vbucket, versions in history.items():
        for state in versions:
            state.check()
            assert leaders.setdefault((vbucket, state.epoch), state.leader) == state.leader, (
                f"vbucket {vbucket} epoch {state.epoch} had two leaders"
            )
        for old, new in itertools.pairwise(versions):
            assert new.epoch >= old.epoch
            term_old = (old.leader, old.leader_epoch_of_node())
            term_new = (new.leader, new.leader_epoch_of_node())
            assert new.epoch == old.epoch + (term_new != term_old)
            if new.leader is not None and term_new != term_old:
                assert new.leader in {node for node, _ in old.isr}, (old, new)


async def record(
    etcd: EtcdClient, keys: ClusterKeys, start: int, history: dict[int, list[VbucketState]]
) -> None:
    prefix = keys.vbuckets
    async with etcd.watch(prefix, prefix_end(prefix), start) as stream:
        async for batch in stream:
            for event in batch.events:
                if event.type is EventType.PUT:
                    vbucket = keys.vbucket_of(event.kv.key)
                    history.setdefault(vbucket, []).append(VbucketState.from_json(event.kv.value))


@pytest.mark.slow
async def test_fault_cycles_keep_leadership_safe(
    etcd_url: str, etcd: EtcdClient, prefix: bytes
) -> None:
    keys = ClusterKeys(prefix)
    rng = random.Random(15)
    history: dict[int, list[VbucketState]] = {}
    settle_times: dict[str, list[float]] = {"crash": [], "lease": [], "stop": []}
    async with trio.open_nursery() as nursery:
        start = (await etcd.get(b"\x00")).revision + 1
        nursery.start_soon(record, etcd, keys, start, history)
        cluster = Cluster(etcd_url, keys, nursery)
        with trio.fail_after(120):
            for name in NAMES:
                await cluster.start(name)
            await eventually_status(etcd, keys, consistent)
            for _ in range(CYCLES):
                fault = rng.choice(("crash", "lease", "stop"))
                victim = rng.choice(sorted(cluster.running))
                # On a loaded machine a node may be between two lives (its
                # lease ran out): the fault hits its next life.
                node = cluster.running[victim].node
                await eventually(partial(registered, node))
                registration = node.registration
                assert registration is not None
                began = trio.current_time()
                if fault == "lease":
                    await etcd.revoke(registration.lease.id)
                else:
                    await cluster.stop(victim, crash=fault == "crash")
                await eventually_status(etcd, keys, partial(settled, (victim, registration.epoch)))
                settle_times[fault].append(trio.current_time() - began)
                if victim not in cluster.running:
                    await cluster.start(victim)
                await eventually_status(etcd, keys, lambda s: len(s.members) == 3)
        nursery.cancel_scope.cancel()
    check_history(history)
    assert sum(len(versions) for versions in history.values()) > SETTINGS.vbuckets
    for fault, times in settle_times.items():
        assert all(t < SETTLE_BOUND for t in times), (fault, times)
    print({fault: [round(t, 2) for t in times] for fault, times in settle_times.items()})


def registered(node: ClusterNode) -> bool:
    return node.registration is not None


def settled(life: tuple[str, int], status: ClusterStatus) -> bool:
    """The node's life ``life`` is no longer a member (gone, or a new life)
    and etcd is consistent with the members."""
    member = status.members.get(life[0])
    return (member is None or member.epoch != life[1]) and consistent(status)


async def eventually_status(
    etcd: EtcdClient, keys: ClusterKeys, condition: Callable[[ClusterStatus], bool]
) -> None:
    while not condition(await read_status(etcd, keys)):  # noqa: ASYNC110 - polling etcd
        await trio.sleep(0.02)
