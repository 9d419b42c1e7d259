"""``flush_acks`` against a broker that stops answering (``broky serve``
SIGSTOPped, a real socket): it raises AckTimeout within ``ack_timeout``
instead of waiting for ever, and gives nothing up, so once the broker runs
again the same frames are acked, or resent on a new connection, and every
message is stored exactly once. The broker process is started here and
killed by PID when the test ends."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from broky import AckTimeout, Client, ErrorCode, connect
from tests.durable.test_workers import KEYS, fetch_all, write_config
from tests.mesh.test_nodes import Node, nodes

pytestmark = pytest.mark.slow

#: The test's ack timeout: short, and far below the bound the test allows.
ACK_TIMEOUT = 1.0
MESSAGES = 5


async def stalled_flush(node: Node, client: Client, label: bytes) -> AckTimeout:
    """Publish ``MESSAGES`` acked messages over two keys while the broker is
    stopped; the AckTimeout of the flush (the broker stays stopped)."""
    os.killpg(node.process.pid, signal.SIGSTOP)
    for n in range(MESSAGES):
        await client.publish(KEYS[n % 2], b"%s-%d" % (label, n), ack=True)
    with trio.fail_after(ACK_TIMEOUT + 5), pytest.raises(AckTimeout) as timed_out:
        await client.flush_acks()
    return timed_out.value


async def test_an_unanswered_flush_raises_in_time_and_a_retry_stores_once(tmp_path: Path) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, 1)
    with nodes() as start, trio.fail_after(40):
        node = start(["--config", str(config)])
        async with connect(node.address, name="stalled") as client:
            client.ack_timeout = ACK_TIMEOUT
            try:
                # Waiting on: the broker runs again and answers the same frames.
                error = await stalled_flush(node, client, b"waited")
                os.killpg(node.process.pid, signal.SIGCONT)
                assert error.code is ErrorCode.OWNER_UNAVAILABLE
                assert (error.frames, set(error.keys)) == (1, {KEYS[0], KEYS[1]})
                assert f"1 acked frame(s) ({MESSAGES} messages, keys {KEYS[0]}, {KEYS[1]})" in str(
                    error
                )
                acked = await client.flush_acks()
                assert sum(run.last_offset - run.first_offset + 1 for run in acked) == MESSAGES
                # Giving the connection up: the frame, maybe stored once the
                # broker reads its old socket, is resent on a new one.
                await stalled_flush(node, client, b"resent")
                client.abort("the test gives the stalled connection up")
            finally:
                os.killpg(node.process.pid, signal.SIGCONT)
            acked = await client.flush_acks()
            assert sum(run.last_offset - run.first_offset + 1 for run in acked) == MESSAGES
            found = await fetch_all(client)
    payloads = sorted(message.payload for messages in found.values() for message in messages)
    assert payloads == sorted(
        b"%s-%d" % (label, n) for label in (b"waited", b"resent") for n in range(MESSAGES)
    )
