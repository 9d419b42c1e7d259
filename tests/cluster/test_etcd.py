"""The etcd client against a real etcd (tests/cluster/conftest.py)."""

from __future__ import annotations

import pytest
import trio

from broky.cluster.etcd import EtcdClient, EtcdUnavailable, WatchStream, parse_endpoints
from broky.cluster.etcd_wire import (
    Compare,
    EtcdError,
    EventType,
    Get,
    Put,
    WatchCompacted,
    b64,
    decode,
    parse_watch_line,
    prefix_end,
)


async def test_put_get_range_delete(etcd: EtcdClient, prefix: bytes) -> None:
    with trio.fail_after(5):
        revision = await etcd.put(prefix + b"a", b"1")
        await etcd.put(prefix + b"b", b"")
        await etcd.put(prefix + b"c/d", b"\x00\xff")
        found = await etcd.get(prefix + b"a")
        assert found.revision >= revision
        (kv,) = found.kvs
        assert (kv.key, kv.value, kv.version) == (prefix + b"a", b"1", 1)
        assert kv.create_revision == kv.mod_revision == revision
        everything = await etcd.get_prefix(prefix)
        assert [(kv.key, kv.value) for kv in everything.kvs] == [
            (prefix + b"a", b"1"),
            (prefix + b"b", b""),
            (prefix + b"c/d", b"\x00\xff"),
        ]
        assert await etcd.delete(prefix, prefix_end(prefix)) == 3
        assert (await etcd.get_prefix(prefix)).kvs == ()


async def test_txn_compare_and_swap(etcd: EtcdClient, prefix: bytes) -> None:
    key = prefix + b"state"
    with trio.fail_after(5):
        absent = Compare.created(key, 0)
        first = await etcd.txn([absent], [Put(key, b"v1")], [Get(key)])
        assert first.succeeded
        second = await etcd.txn([absent], [Put(key, b"other")], [Get(key)])
        assert not second.succeeded
        ((current,),) = second.ranges
        assert current.value == b"v1"
        assert current.mod_revision == first.revision
        # A CAS on the revision just read wins once; the same stale CAS loses.
        swap = await etcd.txn([Compare.modified(key, current.mod_revision)], [Put(key, b"v2")])
        assert swap.succeeded
        stale = await etcd.txn([Compare.modified(key, current.mod_revision)], [Put(key, b"v3")])
        assert not stale.succeeded
        assert await etcd.txn([Compare.value(key, b"v2")], [Get(key)])
        assert not (await etcd.txn([Compare.value(key, b"v1")])).succeeded
        assert (await etcd.get(key)).kvs[0].value == b"v2"


async def test_lease_grant_keepalive_revoke(etcd: EtcdClient, prefix: bytes) -> None:
    key = prefix + b"member"
    with trio.fail_after(5):
        lease = await etcd.grant(5)
        assert lease.ttl == 5
        await etcd.put(key, b"here", lease=lease.id)
        assert (await etcd.get(key)).kvs[0].lease == lease.id
        assert await etcd.keepalive(lease.id) == 5
        assert await etcd.revoke(lease.id)
        assert (await etcd.get(key)).kvs == ()
        assert await etcd.keepalive(lease.id) == 0
        assert not await etcd.revoke(lease.id)


async def test_expired_lease_deletes_its_keys(etcd: EtcdClient, prefix: bytes) -> None:
    key = prefix + b"member"
    with trio.fail_after(10):
        lease = await etcd.grant(1)
        assert lease.ttl == 1  # the test etcd's tuned election timeout allows it
        revision = await etcd.put(key, b"here", lease=lease.id)
        async with etcd.watch(key, start_revision=revision + 1) as stream:
            async for batch in stream:
                if batch.events:
                    break
        assert [event.type for event in batch.events] == [EventType.DELETE]
        assert await etcd.keepalive(lease.id) == 0


async def test_watch_sees_changes_in_order(etcd: EtcdClient, prefix: bytes) -> None:
    with trio.fail_after(5):
        start = await etcd.put(prefix + b"x", b"1")
        await etcd.put(prefix + b"y", b"2")
        await etcd.put(prefix + b"x", b"3")
        await etcd.delete(prefix + b"y")
        seen: list[tuple[EventType, bytes, bytes]] = []
        async with etcd.watch(prefix, prefix_end(prefix), start) as stream:
            async for batch in stream:
                seen.extend((event.type, event.kv.key, event.kv.value) for event in batch.events)
                if len(seen) >= 4:
                    break
        assert seen == [
            (EventType.PUT, prefix + b"x", b"1"),
            (EventType.PUT, prefix + b"y", b"2"),
            (EventType.PUT, prefix + b"x", b"3"),
            (EventType.DELETE, prefix + b"y", b""),
        ]


async def drain(stream: WatchStream) -> None:
    async for _ in stream:
        pass


async def test_watch_from_compacted_revision(etcd: EtcdClient, prefix: bytes) -> None:
    with trio.fail_after(5):
        old = await etcd.put(prefix + b"k", b"1")
        latest = await etcd.put(prefix + b"k", b"2")
        await etcd.call("/v3/kv/compaction", {"revision": str(latest)})
        async with etcd.watch(prefix + b"k", start_revision=old) as stream:
            with pytest.raises(WatchCompacted) as caught:
                await drain(stream)
        assert caught.value.compact_revision == latest


async def test_unreachable_endpoint_is_reported_and_skipped(etcd_url: str) -> None:
    # A closed port first: the client says so, then uses the next endpoint.
    good = parse_endpoints(etcd_url)[0]
    async with EtcdClient(["http://127.0.0.1:1", good]) as client:
        with trio.fail_after(5):
            with pytest.raises(EtcdUnavailable, match=r"127\.0\.0\.1:1\b"):
                await client.get(b"anything")
            assert client.endpoint == good
            assert (await client.get(b"anything")).revision > 0


async def test_etcd_errors_carry_its_code(etcd: EtcdClient) -> None:
    with trio.fail_after(5), pytest.raises(EtcdError, match="future revision") as caught:
        await etcd.call("/v3/kv/range", {"key": b64(b"k"), "revision": str(2**40)})
    assert caught.value.code == 11  # OUT_OF_RANGE


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("etcd://127.0.0.1:2379", ("http://127.0.0.1:2379",)),
        ("etcd://a:1,b:2/", ("http://a:1", "http://b:2")),
        ("http://[::1]:2379", ("http://[::1]:2379",)),
    ],
)
def test_parse_endpoints(url: str, expected: tuple[str, ...]) -> None:
    assert parse_endpoints(url) == expected


@pytest.mark.parametrize(
    "url", ["127.0.0.1:2379", "zk://a:1", "etcd://a", "etcd://a:x", "etcd://a:1/path", "etcd://"]
)
def test_parse_endpoints_refuses(url: str) -> None:
    with pytest.raises(ValueError, match="etcd"):
        parse_endpoints(url)


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\x00"


def test_malformed_answers_raise_etcd_error() -> None:
    with pytest.raises(EtcdError, match="not JSON"):
        decode("<html>")
    with pytest.raises(EtcdError, match="list"):
        decode("[1]")
    with pytest.raises(EtcdError, match="boom"):
        parse_watch_line('{"error": {"grpc_code": 14, "message": "boom"}}')
    with pytest.raises(EtcdError, match="cancelled"):
        parse_watch_line('{"result": {"canceled": true}}')
