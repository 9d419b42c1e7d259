"""A data directory written by ``broky serve --workers 2`` served by
``--workers 3`` and then by ``--workers 2`` again, each after a SIGKILL of
the whole node.

Partition directories do not depend on the worker count (only which worker
owns one does), so at each start every partition is opened, with recovery,
by its new owner. What must hold after each change: every acked message is
read back exactly, offsets stay dense as publishing goes on, and a retry of
an idempotent frame acked before the change is still answered with its
original offsets (the new owner rebuilt the producers' window from the log)
instead of being stored again. Every process is started here on 127.0.0.1
and killed by PID.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import trio

from broky import connect
from broky.client.tcp import parse_address
from broky.protocol.frames import Error, Publish, PublishAck
from tests.conftest import RawConnection, raw_run
from tests.durable.test_workers import KEYS, PARTITIONS, fetch_all, write_config
from tests.mesh.test_nodes import nodes

pytestmark = pytest.mark.slow

PRODUCER = 0x00C0_FFEE_0000_0014
#: One idempotent frame with a message for every partition.
RETRIED = Publish(
    1,
    tuple(raw_run(key.encode(), b"retried-%d" % n) for n, key in enumerate(KEYS)),
    ack=True,
    producer_id=PRODUCER,
    first_sequence=1,
)


async def send_retried(address: str) -> list[tuple[int, ...]]:
    """Send RETRIED on a raw connection; the offsets its ack gives."""
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        connection = RawConnection(stream)
        await connection.handshake()
        await connection.send_frame(RETRIED)
        while True:
            answer = await connection.receive_frame()
            if isinstance(answer, PublishAck):
                return list(
                    zip(answer.partitions, answer.first_offsets, answer.last_offsets, strict=True)
                )
            assert not isinstance(answer, Error), answer


async def serve_round(
    address: str, round_: int, acked: dict[int, list[bytes]]
) -> tuple[list[tuple[int, ...]], dict[int, list[bytes]]]:
    """Publish a round of acked messages to every partition, resend RETRIED,
    and read everything back."""
    async with connect(address, name=f"round{round_}") as client:
        sent: dict[str, list[bytes]] = defaultdict(list)
        for n in range(200):
            key = KEYS[n % PARTITIONS]
            payload = b"%d-%d" % (round_, n)
            await client.publish(key, payload, ack=True)
            sent[key].append(payload)
        for ack in await client.flush_acks():
            count = ack.last_offset - ack.first_offset + 1
            assert ack.first_offset == len(acked[ack.partition]), "offsets are not dense"
            acked[ack.partition].extend(sent[ack.key][:count])
            del sent[ack.key][:count]
    retried = await send_retried(address)
    async with connect(address, name="reader") as client:
        found = await fetch_all(client)
    return retried, {p: [m.payload for m in messages] for p, messages in found.items()}


async def test_restart_with_another_worker_count_reopens_every_partition(tmp_path: Path) -> None:
    config = tmp_path / "broky.toml"
    acked: dict[int, list[bytes]] = defaultdict(list)
    first_answer: list[tuple[int, ...]] = []
    with trio.fail_after(90):
        for round_, workers in enumerate([2, 3, 2]):
            write_config(config, workers)
            with nodes() as start:
                node = start(["--config", str(config)])
                if round_ == 0:
                    first_answer = await send_retried(node.address)
                    for partition, first, _ in first_answer:
                        acked[partition].append(b"retried-%d" % partition)
                        assert first == 0
                retried, stored = await serve_round(node.address, round_, acked)
                # node.kill() (SIGKILL of the whole group) ends the round.
            assert retried == first_answer, f"a retry was stored again with {workers} workers"
            assert stored == dict(acked), f"the log differs from the acks with {workers} workers"
    assert sum(len(payloads) for payloads in acked.values()) == PARTITIONS + 3 * 200
