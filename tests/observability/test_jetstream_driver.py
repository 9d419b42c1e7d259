"""The raw NATS protocol parser and the JetStream driver of the comparison benchmark."""

from __future__ import annotations

import shutil

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from broky.loadtest import jetstream, peers
from broky.loadtest.jetstream_cluster import jetstream_cluster
from broky.loadtest.natsproto import (
    Err,
    Info,
    Msg,
    NatsParser,
    NatsProtocolError,
    Ok,
    Ping,
    Pong,
    pub,
)

tokens = st.text(alphabet="abcdefghijk.$_0123456789", min_size=1, max_size=12).map(str.encode)
payloads = st.binary(max_size=64)


@st.composite
def events(draw: st.DrawFn) -> tuple[bytes, object]:
    """One server event and its wire bytes."""
    kind = draw(st.sampled_from(["msg", "msg_reply", "hmsg", "ping", "pong", "ok", "err", "info"]))
    if kind.startswith("msg"):
        subject, payload = draw(tokens), draw(payloads)
        reply = draw(tokens) if kind == "msg_reply" else b""
        middle = b" " + reply if reply else b""
        wire = b"MSG %s 7%s %d\r\n%s\r\n" % (subject, middle, len(payload), payload)
        return wire, Msg(subject, b"7", reply, payload)
    if kind == "hmsg":
        subject, headers, payload = draw(tokens), b"NATS/1.0 408\r\n\r\n", draw(payloads)
        size = len(headers) + len(payload)
        wire = b"HMSG %s 3 %d %d\r\n%s%s\r\n" % (subject, len(headers), size, headers, payload)
        return wire, Msg(subject, b"3", b"", payload, headers)
    if kind == "err":
        return b"-ERR 'Slow Consumer'\r\n", Err("Slow Consumer")
    if kind == "info":
        return b'INFO {"server_id":"x"}\r\n', Info(b'{"server_id":"x"}')
    return {"ping": (b"PING\r\n", Ping()), "pong": (b"PONG\r\n", Pong()), "ok": (b"+OK\r\n", Ok())}[
        kind
    ]


@given(stream=st.lists(events(), max_size=20), cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_events_come_out_whole_however_the_bytes_are_cut(
    stream: list[tuple[bytes, object]], cuts: list[int]
) -> None:
    wire = b"".join(part for part, _ in stream)
    parser = NatsParser()
    got: list[object] = []
    last = 0
    for cut in [*sorted(min(cut, len(wire)) for cut in cuts), len(wire)]:
        got.extend(parser.feed(wire[last:cut]))
        last = cut
    assert got == [event for _, event in stream]


def test_garbage_is_refused() -> None:
    with pytest.raises(NatsProtocolError):
        NatsParser().feed(b"HELLO there\r\n")
    with pytest.raises(NatsProtocolError):
        NatsParser().feed(b"MSG a 1 3\r\nabcXY")
    with pytest.raises(NatsProtocolError):
        NatsParser().feed(b"x" * 5000)


def test_pub_lines() -> None:
    assert pub(b"a.b", b"hi") == b"PUB a.b 2\r\nhi\r\n"
    assert pub(b"a.b", b"", b"_INBOX.1") == b"PUB a.b _INBOX.1 0\r\n\r\n"


@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server is not installed")
async def test_jetstream_publishes_are_acked_and_a_pull_consumer_acks_them_all() -> None:
    """Against a real ``nats-server -js``: every publish acked, every message
    delivered once and acked, the consumer's ack floor at the last one."""
    with peers.peer_server("nats", jetstream=True) as (_, address):
        await jetstream.recreate_stream(address)
        published, acked, _ = await jetstream.publish(
            address, 3, lambda index: [b"bench.k%d" % n for n in range(100)], b"x" * 10,
            messages=1000,
        )  # fmt: skip
        assert (published, acked) == (1000, 1000)
        with trio.fail_after(30):
            seen, _ = await jetstream.consume(address, 2, 1000)
        assert sorted(seen) == list(range(1, 1001))


@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server is not installed")
def test_a_three_replica_stream_on_the_benchmark_cluster_acks_every_publish() -> None:
    """``bench_replication``'s peer: three clustered servers, a stream with
    three replicas, publishers spread over the servers, every publish acked,
    and the stream reports two replicas beside its leader."""

    async def run(addresses: list[tuple[str, int]]) -> tuple[int, int, object]:
        await jetstream.recreate_stream(addresses[0], replicas=3, subjects="orders.>")
        published, acked, _ = await jetstream.publish(
            addresses[0], 3, lambda index: [b"orders.c%d" % index] * 100, b"x" * 10,
            messages=900, spread=addresses,
        )  # fmt: skip
        api = await jetstream.NatsConnection.open(addresses[1])
        try:
            info = await api.request(f"$JS.API.STREAM.INFO.{jetstream.STREAM}")
        finally:
            await api.aclose()
        return published, acked, info

    with jetstream_cluster(3) as servers:
        published, acked, info = trio.run(run, [address for _, address in servers])
    assert (published, acked) == (900, 900)
    assert isinstance(info, dict)
    assert info["state"]["messages"] == 900
    assert len(info["cluster"]["replicas"]) == 2
