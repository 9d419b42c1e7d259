"""Controller, failover and fencing with three in-process nodes on a real etcd."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
import trio

from broky.cluster.controller import Controller, NotController, Write
from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import Compare
from broky.cluster.keys import ClusterKeys
from broky.cluster.leadership import Fenced, Term, change_isr, check_leader
from broky.cluster.membership import Membership, NodeInfo, register
from broky.cluster.node import ClusterNode
from broky.cluster.settings import ClusterSettings
from broky.cluster.state import VbucketState
from broky.cluster.vbuckets import StoredState, states_of
from tests.conftest import eventually

SETTINGS = ClusterSettings(vbuckets=16, replication_factor=3)


async def read_states(etcd: EtcdClient, keys: ClusterKeys) -> dict[int, StoredState]:
    found = await etcd.get_prefix(keys.vbuckets)
    return states_of(keys, {kv.key: kv for kv in found.kvs})


@pytest.fixture
async def nodes(etcd_url: str, prefix: bytes) -> AsyncIterator[list[ClusterNode]]:
    """Three nodes, each with its own etcd client, fully placed."""
    keys = ClusterKeys(prefix)
    started = []
    async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
        with trio.fail_after(10):
            for name in ("n1", "n2", "n3"):
                client = await stack.enter_async_context(EtcdClient.from_url(etcd_url))
                node = ClusterNode(client, keys, NodeInfo(name), SETTINGS, lease_ttl=1)
                await nursery.start(node.run)
                started.append(node)
            # Every node's view has the whole placement.
            await eventually(
                lambda: all(len(n.vbuckets.states()) == SETTINGS.vbuckets for n in started)
            )
        yield started
        nursery.cancel_scope.cancel()


def controller_of(nodes: list[ClusterNode]) -> list[ClusterNode]:
    return [node for node in nodes if node.controller and node.controller.epoch is not None]


async def test_a_new_cluster_is_placed_with_one_controller(
    nodes: list[ClusterNode], etcd: EtcdClient, prefix: bytes
) -> None:
    keys = ClusterKeys(prefix)
    states = await read_states(etcd, keys)
    assert sorted(states) == list(range(SETTINGS.vbuckets))
    epochs = {node.node_id: node.registration.epoch for node in nodes if node.registration}
    for stored in states.values():
        state = stored.state
        assert sorted(state.replicas) == ["n1", "n2", "n3"]
        assert state.leader == state.replicas[0]
        assert state.epoch == 1
        assert state.isr == tuple((node, epochs[node]) for node in state.replicas)
    with trio.fail_after(5):
        await eventually(lambda: len(controller_of(nodes)) == 1)
    # Leaders are spread (the balancer's bound: within 2 of each other).
    leads = [len(node.terms()) for node in nodes]
    assert sum(leads) == SETTINGS.vbuckets
    assert max(leads) - min(leads) <= 2, leads
    (controller,) = controller_of(nodes)
    stats = [node.statistics() for node in nodes]
    assert [s.controller_epoch > 0 for s in stats] == [node is controller for node in nodes]
    assert sum(s.vbuckets_led for s in stats) == SETTINGS.vbuckets
    # Each node's membership view is a watch of its own: it may see the
    # last join a moment after the placement that needed it.
    with trio.fail_after(5):
        await eventually(
            lambda: all(
                (s.lives, s.members, s.vbuckets) == (1, 3, SETTINGS.vbuckets)
                for s in (node.statistics() for node in nodes)
            )
        )
    holder = (await etcd.get(keys.controller)).kvs[0]
    assert holder.value == controller.node_id.encode()
    assert controller.controller is not None
    assert holder.create_revision == controller.controller.epoch


async def fail_over(
    nodes: list[ClusterNode], etcd: EtcdClient, prefix: bytes, victim: ClusterNode
) -> float:
    """Kill ``victim``'s lease; check its vbuckets fail over; return how long it took."""
    keys = ClusterKeys(prefix)
    before = await read_states(etcd, keys)
    registration = victim.registration
    assert registration is not None
    led = {v for v, stored in before.items() if stored.state.leader == victim.node_id}
    assert led, "the victim leads nothing"
    started = trio.current_time()
    await etcd.revoke(registration.lease.id)

    watcher = nodes[0] if nodes[0] is not victim else nodes[1]
    # The placement seen the moment the failover is complete: the victim
    # registers again as a new life soon after, and the balancer then moves
    # leaders to it (later epochs), so a read of etcd after this point may
    # already show that second step.
    seen: dict[int, StoredState] = {}

    def failed_over() -> bool:
        states = watcher.vbuckets.states()
        if any((victim.node_id, registration.epoch) in states[v].state.isr for v in states):
            return False
        seen.update(states)
        return True

    with trio.fail_after(5):
        await eventually(failed_over)
    elapsed = trio.current_time() - started
    after = seen
    for vbucket, stored in after.items():
        old, new = before[vbucket].state, stored.state
        if vbucket in led:
            assert new.leader != victim.node_id
            assert new.epoch == old.epoch + 1
            assert new.leader in {node for node, _ in old.isr}
        else:
            assert (new.leader, new.epoch) == (old.leader, old.epoch), (
                victim.node_id,
                vbucket,
                old,
                new,
                {v: (s.state.leader, s.state.epoch) for v, s in before.items()},
            )
        assert new.isr == tuple(entry for entry in old.isr if entry[0] != victim.node_id)
    return elapsed


async def test_a_dead_leaders_vbuckets_get_new_leaders_from_the_isr(
    nodes: list[ClusterNode], etcd: EtcdClient, prefix: bytes
) -> None:
    with trio.fail_after(5):
        await eventually(lambda: len(controller_of(nodes)) == 1)
    (controller,) = controller_of(nodes)
    victim = next(node for node in nodes if node is not controller)
    led = len(victim.terms())
    elapsed = await fail_over(nodes, etcd, prefix, victim)
    assert elapsed < 5.0, f"failover took {elapsed:.2f} s"  # revoked: milliseconds, loosely
    # Counted when the controller's transaction returns, which may be just
    # after the watcher saw its result.
    with trio.fail_after(5):
        await eventually(lambda: controller.statistics().elections == led)
    # The victim notices, registers again as a new life, and leads nothing.
    with trio.fail_after(5):
        await eventually(lambda: victim.lives == 2 and victim.registration is not None)
    assert victim.terms() == {}


async def test_the_controllers_death_elects_another_controller(
    nodes: list[ClusterNode], etcd: EtcdClient, prefix: bytes
) -> None:
    with trio.fail_after(5):
        await eventually(lambda: len(controller_of(nodes)) == 1)
    (old,) = controller_of(nodes)
    assert old.controller is not None
    old_epoch = old.controller.epoch
    await fail_over(nodes, etcd, prefix, old)
    with trio.fail_after(5):
        await eventually(lambda: len(controller_of(nodes)) == 1)
    (new,) = controller_of(nodes)
    assert new.controller is not None
    assert new.controller.epoch != old_epoch


async def race(etcd: EtcdClient, keys: ClusterKeys, membership: Membership) -> None:
    """Two controllers campaign at once: one wins; deposed, the other does."""
    contenders = [
        Controller(etcd, keys, f"c{i}", (await etcd.grant(5)).id, SETTINGS, membership)
        for i in range(2)
    ]
    winners: list[tuple[Controller, int]] = []

    async def campaign(contender: Controller) -> None:
        winners.append((contender, await contender.campaign()))

    async with trio.open_nursery() as nursery:
        for contender in contenders:
            nursery.start_soon(campaign, contender)
        await eventually(lambda: len(winners) >= 1)
        await trio.sleep(0.2)  # the loser would have won by now
        assert len(winners) == 1
        winner, epoch = winners[0]
        loser = contenders[1 - contenders.index(winner)]
        await winner.reconcile(epoch)
        # Depose the winner: the loser takes over with a later epoch.
        await etcd.revoke(winner.lease)
        await eventually(lambda: len(winners) == 2)
        assert winners[1] == (loser, winners[1][1])
        assert winners[1][1] > epoch
    # The deposed controller's guarded write fails and changes nothing.
    stored = (await read_states(etcd, keys))[0]
    stale = Write(0, stored.kv.mod_revision, stored.state, stored.state)
    with pytest.raises(NotController):
        await winner._write(epoch, [stale])
    assert (await read_states(etcd, keys))[0].kv == stored.kv
    await etcd.revoke(loser.lease)


async def test_two_controllers_never_both_win(etcd: EtcdClient, prefix: bytes) -> None:
    keys = ClusterKeys(prefix)
    membership = Membership(etcd, keys)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            await nursery.start(membership.run)
            registrations = [
                await register(etcd, keys, NodeInfo(name), ttl=5, wait=1)
                for name in ("a", "b", "c")
            ]
            await eventually(lambda: len(membership.members()) == 3)
            for _ in range(5):
                await race(etcd, keys, membership)
            assert len(await read_states(etcd, keys)) == SETTINGS.vbuckets
            for registration in registrations:
                await etcd.revoke(registration.lease.id)
        nursery.cancel_scope.cancel()


async def test_a_controller_plans_from_etcd_not_a_lagging_membership_view(
    etcd: EtcdClient, prefix: bytes
) -> None:
    """A controller elected on the watch of the controller key may have seen
    the old controller's death before its membership watch saw the joins
    and leaves around it: it must plan from what etcd holds. Its membership
    view here is never started (as stale as a view can be): the placement
    still names the three registered nodes, all in every ISR."""
    keys = ClusterKeys(prefix)
    stale = Membership(etcd, keys)
    with trio.fail_after(10):
        registrations = [
            await register(etcd, keys, NodeInfo(name), ttl=5, wait=1) for name in ("a", "b", "c")
        ]
        controller = Controller(etcd, keys, "a", registrations[0].lease.id, SETTINGS, stale)
        await controller.reconcile(await controller.campaign())
        states = await read_states(etcd, keys)
        for registration in registrations:
            await etcd.revoke(registration.lease.id)
    assert stale.members() == {}
    assert sorted(states) == list(range(SETTINGS.vbuckets))
    epochs = {"a": registrations[0].epoch, "b": registrations[1].epoch, "c": registrations[2].epoch}
    for stored in states.values():
        assert sorted(stored.state.isr) == sorted(epochs.items())


async def test_a_deposed_leader_is_fenced(
    nodes: list[ClusterNode], etcd: EtcdClient, prefix: bytes
) -> None:
    keys = ClusterKeys(prefix)
    with trio.fail_after(5):
        await eventually(lambda: len(controller_of(nodes)) == 1)
    leader = next(node for node in nodes if node not in controller_of(nodes))
    vbucket, term = next(iter(leader.terms().items()))
    with trio.fail_after(5):
        stored = await check_leader(etcd, keys, term)
        # The leader shrinks its ISR by CAS: allowed while it leads.
        follower = stored.state.isr[-1]
        shrunk = await change_isr(etcd, keys, term, [e for e in stored.state.isr if e != follower])
        assert follower not in shrunk.isr
        assert (await read_states(etcd, keys))[vbucket].state == shrunk
        # A stale CAS on the revision it read before loses.
        stale = Compare.modified(keys.vbucket(vbucket), stored.kv.mod_revision)
        assert not (await etcd.txn([stale])).succeeded
    await fail_over_vbucket(nodes, etcd, keys, leader, vbucket, term)


async def fail_over_vbucket(
    nodes: list[ClusterNode],
    etcd: EtcdClient,
    keys: ClusterKeys,
    leader: ClusterNode,
    vbucket: int,
    term: Term,
) -> None:
    registration = leader.registration
    assert registration is not None
    await etcd.revoke(registration.lease.id)
    with trio.fail_after(5):
        while True:
            state: VbucketState = (await read_states(etcd, keys))[vbucket].state
            if state.epoch > term.epoch:
                break
            await trio.sleep(0.02)
        with pytest.raises(Fenced) as caught:
            await check_leader(etcd, keys, term)
        assert caught.value.state is not None
        assert caught.value.state.epoch == term.epoch + 1
        with pytest.raises(Fenced):
            await change_isr(etcd, keys, term, [(leader.node_id, registration.epoch)])
