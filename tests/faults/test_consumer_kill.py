"""A consumer process SIGKILLed with messages in flight: another consumer of
the shared subscription gets them, and nothing whose ack was receipted comes
back.

The victim is a real ``client.consumer`` in a child process: it acks a
first part of what it receives, waits for the receipts (``flush``), reports
those offsets, then takes more without acking and is SIGKILLed by pid. The
checker then holds the whole story: every published message is acked by
someone, the receipted ones are never delivered again, and only what the
victim held unacked is delivered twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

import broky
from broky import Delivery, Start
from tests.conftest import StartBroker, address_of
from tests.subscriptions.wire import subscriptions_config

MESSAGES = 300
#: What the victim acks and flushes before it starts holding messages.
ACKED_FIRST = 60
TIMEOUT = 30

VICTIM = """
import sys, trio, broky

async def main(address):
    async with broky.connect(address) as client, client.consumer(
        "orders.>", subscription="work", start=broky.Start.earliest(), credit=100
    ) as consumer:
        acked = []
        async for delivery in consumer:
            if len(acked) < {acked_first}:
                await delivery.ack()
                acked.append(delivery)
                if len(acked) == {acked_first}:
                    await consumer.flush()
                    for done in acked:
                        print("acked", done.partition, done.offset, flush=True)
                continue
            print("holding", delivery.partition, delivery.offset, flush=True)

trio.run(main, sys.argv[1])
"""


async def test_a_killed_consumers_unacked_messages_go_to_another_and_receipted_acks_stay(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    broker = await start_broker(subscriptions_config(tmp_path))
    address = address_of(broker)
    receipted: set[tuple[int, int]] = set()
    held: set[tuple[int, int]] = set()
    survivor_got: list[Delivery] = []
    with trio.fail_after(TIMEOUT):
        async with broker.connect() as client:
            for number in range(MESSAGES):
                await client.publish(f"orders.k{number % 8}", b"%d" % number, ack=True)
            await client.flush_acks()
        script = VICTIM.format(acked_first=ACKED_FIRST)
        victim = await trio.lowlevel.open_process(
            [sys.executable, "-c", script, address],
            stdout=subprocess.PIPE,
        )
        try:
            assert victim.stdout is not None
            lines = b""
            # The victim holds its whole credit window once it has printed
            # that many "holding" lines; then it is killed mid-work.
            while len(held) < 40:
                chunk = await victim.stdout.receive_some(65536)
                assert chunk, "the victim ended before it held messages"
                lines += chunk
                *complete, lines = lines.split(b"\n")
                for line in complete:
                    word, partition, offset = line.split()
                    target = receipted if word == b"acked" else held
                    target.add((int(partition), int(offset)))
        finally:
            os.kill(victim.pid, signal.SIGKILL)
            await victim.wait()
        assert len(receipted) == ACKED_FIRST
        async with (
            broky.connect(address) as survivor_client,
            survivor_client.consumer(
                "orders.>", subscription="work", start=Start.earliest()
            ) as survivor,
        ):
            async for delivery in survivor:
                survivor_got.append(delivery)
                await delivery.ack()
                if len({(d.partition, d.offset) for d in survivor_got}) == MESSAGES - ACKED_FIRST:
                    break
            await survivor.flush()
    survivor_offsets = [(d.partition, d.offset) for d in survivor_got]
    # Nothing receipted delivered again; together, every message acked once.
    assert not receipted & set(survivor_offsets)
    assert len(receipted) + len(set(survivor_offsets)) == MESSAGES
    # What the victim held came back, as redeliveries.
    redelivered = {(d.partition, d.offset) for d in survivor_got if d.delivery_count > 1}
    assert held <= redelivered
    assert len(survivor_offsets) == len(set(survivor_offsets))  # no duplicates at the survivor
    [status] = broker.statistics().subscriptions
    assert (status.acked, status.backlog, status.in_flight) == (MESSAGES, 0, 0)
