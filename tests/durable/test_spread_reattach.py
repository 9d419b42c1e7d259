"""A consumer spread over several workers rides out its owners' restarts.

``broky serve --workers 3``: one ``client.consumer`` is connected to one
worker (its *ingress*) and reads the partitions of all three; publishers
publish with acks while the other workers are SIGKILLed one at a time (the
supervisor restarts them). The consumer re-attaches each restarted owner by
itself: the application sees no error, and in the end every acknowledged
publish was delivered to it and acked. Every process is started here, on
127.0.0.1, and killed by PID when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from pathlib import Path

import pytest
import trio

from broky import Start, connect
from tests.durable.test_workers import (
    KEYS,
    all_partitions_writable,
    publish_until_cancelled,
    write_config,
)
from tests.mesh.test_nodes import Node, nodes

pytestmark = pytest.mark.slow

#: Owner kills, each once every partition is writable again.
KILLS = 3
#: Seconds to let the consumer catch up after the last kill.
DRAIN_SECONDS = 30.0


def _established_on(port: int) -> set[str]:
    """Inodes of the established TCP sockets whose local port is ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == "01":  # ESTABLISHED
                    inodes.add(fields[9])
    return inodes


def ingress_workers(node: Node) -> set[int]:
    """The workers holding a client connection on the node's port."""
    inodes = _established_on(int(node.address.rsplit(":", 1)[1]))
    found = set()
    for pid in node.workers():
        directory = f"/proc/{pid}/fd"
        for fd in os.listdir(directory):
            try:
                target = os.readlink(f"{directory}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                found.add(pid)
    return found


async def test_a_spread_consumer_reattaches_sigkilled_owners_without_an_error(
    tmp_path: Path,
) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, 3)
    rng = random.Random(1304)
    published: dict[bytes, int] = {}
    acked: set[bytes] = set()
    failures = [0]
    with nodes() as start, trio.fail_after(40 + KILLS * 20 + DRAIN_SECONDS):
        node = start(["--config", str(config)])
        await all_partitions_writable(node.address, time.monotonic() + 20)
        async with connect(node.address, name="consumer") as client:
            [ingress] = ingress_workers(node)  # the only client connected now
            async with client.consumer(
                "orders.>", subscription="ride", start=Start.earliest(), ack_timeout=2.0
            ) as consumer:

                async def consume() -> None:
                    async for delivery in consumer:  # an error here fails the test
                        acked.add(delivery.payload)
                        await delivery.ack()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume)
                    async with trio.open_nursery() as publishers:
                        for index in range(2):
                            publishers.start_soon(
                                publish_until_cancelled, node.address, index, published, failures
                            )
                        for _ in range(KILLS):
                            await trio.sleep(rng.uniform(0.5, 1.0))
                            victim = rng.choice([p for p in node.workers() if p != ingress])
                            os.kill(victim, signal.SIGKILL)
                            await all_partitions_writable(node.address, time.monotonic() + 20)
                        await trio.sleep(0.5)
                        publishers.cancel_scope.cancel()
                    with trio.move_on_after(DRAIN_SECONDS):
                        while not published.keys() <= acked:  # noqa: ASYNC110 - a checker's poll
                            await trio.sleep(0.05)
                    nursery.cancel_scope.cancel()
                statistics = consumer.statistics()
    missing = published.keys() - acked
    assert len(published) > 300
    assert not missing, f"{len(missing)} acknowledged publishes never delivered and acked"
    print(
        f"kills={KILLS} published={len(published)} acked={len(acked)} "
        f"received={statistics.received} unconfirmed_settles={statistics.unconfirmed_settles} "
        f"failed_publish_frames={failures[0]}"
    )


#: Messages published before the attach that the owner's death interrupts.
BEFORE_ATTACH = 40


async def test_an_owner_sigkilled_while_a_consumer_attaches_is_waited_for(
    tmp_path: Path,
) -> None:
    """Issue 13, gap 2: an owner that dies while a spread consumer attaches
    (here stopped, so it cannot answer, then SIGKILLed; the supervisor
    restarts it) used to end the attach with ``OwnerUnavailable``. The
    consumer now sends that owner's part again once it is back, within the
    re-attach window, and reads every message."""
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    with nodes() as start, trio.fail_after(60):
        node = start(["--config", str(config)])
        await all_partitions_writable(node.address, time.monotonic() + 20)
        async with connect(node.address, name="publisher") as publisher:
            for number in range(BEFORE_ATTACH):
                await publisher.publish(KEYS[number % len(KEYS)], b"%d" % number, ack=True)
            await publisher.flush_acks()
        async with connect(node.address, name="consumer") as client:
            [ingress] = ingress_workers(node)
            [owner] = [pid for pid in node.workers() if pid != ingress]
            os.kill(owner, signal.SIGSTOP)
            expected = {b"%d" % number for number in range(BEFORE_ATTACH)}
            got: set[bytes] = set()  # and the probes all_partitions_writable sent
            try:

                async def consume() -> None:
                    async with client.consumer(
                        "orders.>", subscription="late", start=Start.earliest()
                    ) as consumer:
                        async for delivery in consumer:  # an error here fails the test
                            got.add(delivery.payload)
                            await delivery.ack()
                            if expected <= got:
                                return

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume)
                    await trio.sleep(0.5)  # the Consume waits on the stopped owner
                    os.kill(owner, signal.SIGKILL)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(owner, signal.SIGKILL)
    assert expected <= got
