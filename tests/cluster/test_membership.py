"""Nodes register under leases; the view of live members follows etcd."""

from __future__ import annotations

import pytest
import trio

from broky.cluster.etcd import EtcdClient, Lease
from broky.cluster.keys import ClusterKeys
from broky.cluster.membership import (
    LeaseKeeper,
    LeaseLost,
    Membership,
    NodeIdTaken,
    NodeInfo,
    register,
)
from tests.conftest import eventually


def info(node_id: str) -> NodeInfo:
    return NodeInfo(node_id, address=f"127.0.0.1:{7000 + len(node_id)}", workers=2)


async def test_members_join_and_leave(
    etcd: EtcdClient, prefix: bytes, nursery: trio.Nursery
) -> None:
    keys = ClusterKeys(prefix)
    view = Membership(etcd, keys)
    with trio.fail_after(10):
        await nursery.start(view.run)
        assert view.members() == {}
        one = await register(etcd, keys, info("n1"), ttl=1, wait=1)
        two = await register(etcd, keys, info("n2"), ttl=1, wait=1)
        keeper = LeaseKeeper(etcd, one.lease)
        keeping = trio.CancelScope()

        async def keep() -> None:
            with keeping, pytest.raises(LeaseLost):
                await keeper.run()

        nursery.start_soon(keep)
        await eventually(lambda: set(view.members()) == {"n1", "n2"})
        members = view.members()
        assert members["n1"].info == info("n1")
        assert members["n1"].epoch < members["n2"].epoch
        assert members["n2"].lease == two.lease.id
        # n2 never renews: etcd expires it after its 1 s TTL; n1 stays.
        started = trio.current_time()
        await eventually(lambda: set(view.members()) == {"n1"})
        assert trio.current_time() - started < 3
        # A clean shutdown (revoke) is seen at once.
        keeping.cancel()
        await etcd.revoke(one.lease.id)
        await eventually(lambda: view.members() == {})


async def test_lease_keeper_reports_a_revoked_lease(etcd: EtcdClient, prefix: bytes) -> None:
    keys = ClusterKeys(prefix)
    with trio.fail_after(5):
        mine = await register(etcd, keys, info("n1"), ttl=1, wait=1)
        keeper = LeaseKeeper(etcd, mine.lease)
        await etcd.revoke(mine.lease.id)
        with pytest.raises(LeaseLost, match="expired"):
            await keeper.run()


async def test_lease_keeper_gives_up_when_etcd_is_unreachable() -> None:
    async with EtcdClient(["http://127.0.0.1:1"]) as unreachable:
        keeper = LeaseKeeper(unreachable, Lease(1, 1))
        with trio.fail_after(3), pytest.raises(LeaseLost, match="whole TTL"):
            await keeper.run()


async def test_a_node_id_in_use_is_refused_then_reusable(etcd: EtcdClient, prefix: bytes) -> None:
    keys = ClusterKeys(prefix)
    with trio.fail_after(10):
        first = await register(etcd, keys, info("n1"), ttl=5, wait=1)
        with pytest.raises(NodeIdTaken, match="n1"):
            await register(etcd, keys, info("n1"), ttl=5, wait=0.3)
        # The refused attempt's own lease is gone, not left to expire.
        assert len((await etcd.get_prefix(keys.nodes)).kvs) == 1

        async def release() -> None:
            await trio.sleep(0.2)
            await etcd.revoke(first.lease.id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release)
            second = await register(etcd, keys, info("n1"), ttl=5, wait=3)
        assert second.epoch > first.epoch
        await etcd.revoke(second.lease.id)


async def test_unreadable_entries_are_skipped(
    etcd: EtcdClient, prefix: bytes, nursery: trio.Nursery
) -> None:
    keys = ClusterKeys(prefix)
    await etcd.put(keys.node("junk"), b"not json")
    await etcd.put(keys.node("liar"), info("n9").to_json())
    await etcd.put(keys.node("list"), b"[1]")
    await etcd.put(keys.node("n3"), info("n3").to_json())
    view = Membership(etcd, keys)
    with trio.fail_after(5):
        await nursery.start(view.run)
    assert set(view.members()) == {"n3"}


@pytest.mark.parametrize("bad", ["", "-x", "a/b", "x" * 65, "é"])
def test_node_ids_are_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="node id"):
        NodeInfo(bad)
