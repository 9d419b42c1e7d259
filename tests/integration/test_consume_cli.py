"""``broky sub --subscription``: prints each delivery, then acks it, over TCP.

The broker is the scripted one of tests/client (the real broker does not
serve ``Consume`` yet); the command runs in-process on a real socket.
"""

from __future__ import annotations

import time
from functools import partial

import pytest
import trio

from broky.cli import build_parser
from broky.consume_cli import consume
from broky.protocol.constants import SettleKind
from broky.protocol.frames import Consume, Run, Settle, Unsubscribe
from broky.protocol.message import encode_message, pack_sizes
from tests.client.scripted_broker import ScriptedBroker


def _run(base_offset: int, payloads: list[bytes]) -> Run:
    blobs = [encode_message(payload) for payload in payloads]
    return Run(
        b"orders.eu", time.time_ns(), len(blobs), pack_sizes([len(b) for b in blobs]),
        b"".join(blobs), 3, base_offset,
    )  # fmt: skip


async def test_sub_with_a_subscription_prints_then_acks_what_it_printed(
    nursery: trio.Nursery, capsys: pytest.CaptureFixture[str]
) -> None:
    brokers: list[ScriptedBroker] = []

    async def serve(stream: trio.SocketStream) -> None:
        broker = ScriptedBroker(stream)
        broker.deliver_on_consume = (_run(40, [b"one", b"two", b"three", b"four"]),)
        brokers.append(broker)
        await broker.serve()

    [listener] = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
    port = listener.socket.getsockname()[1]
    args = build_parser().parse_args(
        ["sub", "orders.>", "--subscription", "billing", "--type", "key-shared",
         "--start", "earliest", "--count", "3", "--show-offsets",
         "--address", f"127.0.0.1:{port}"]
    )  # fmt: skip
    with trio.fail_after(10):
        await consume(args)
        [broker] = brokers
        await broker.wait_for(Unsubscribe)
    assert capsys.readouterr().out.splitlines() == [
        "/3@40 #1 [orders.eu] one",
        "/3@41 #1 [orders.eu] two",
        "/3@42 #1 [orders.eu] three",
    ]
    [consume_frame] = broker.of(Consume)
    assert consume_frame.subscription == "billing"
    # Exactly the three printed messages were acked (the fourth is redelivered to the next one).
    [settle] = broker.of(Settle)
    assert (settle.kind, settle.partitions, settle.first_offsets, settle.last_offsets) == (
        SettleKind.ACK, (3,), (40,), (42,),
    )  # fmt: skip
