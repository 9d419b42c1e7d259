"""A broker process killed with SIGKILL while a publisher publishes with acks
keeps every acknowledged message: after each restart, each is present exactly
once, in order, per partition (read back with Fetch)."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.process
import os
import random
import signal
import socket
import time
from collections import defaultdict
from pathlib import Path

import trio

from broky import BrokyError, Message, connect
from broky.cli import main

#: The issue asks for at least 50 kill cycles; each costs ~0.2-0.4 s.
CYCLES = 50
#: Bound of the whole test: the cycles stop early rather than run long. It
#: takes ~15-30 s here alone, 58 to over 90 s while the suite's other pytest
#: worker runs Spark or another fault test on the same two cores (49 cycles
#: fit in 90 s once, a failure); the bound leaves room for that, as falling
#: short of CYCLES fails the test, and stays under pytest's 300 s timeout.
BUDGET_SECONDS = 200.0
#: Fork: the child starts the real ``broky serve`` entry point (cli.main)
#: without paying for a fresh interpreter's imports; it is still a separate
#: process, and SIGKILL still kills it mid-write.
CONTEXT = multiprocessing.get_context("fork")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def write_config(path: Path, data_dir: Path, port: int) -> None:
    path.write_text(
        f'host = "127.0.0.1"\nport = {port}\nworkers = 1\nlog_level = "error"\n'
        f'data_dir = "{data_dir}"\nsystem_events = false\nsystem_metrics_interval = 0\n'
        "[[durable]]\n"
        'name = "orders"\npattern = "orders.>"\npartitions = 3\nfsync = "always"\n'
        "segment_bytes = 65536\n"
    )


def serve(config_path: str) -> None:
    os._exit(main(["serve", "--config", config_path]))


def start_broker(config_path: Path) -> multiprocessing.process.BaseProcess:
    """Fork a ``broky serve`` process."""
    process = CONTEXT.Process(target=serve, args=(str(config_path),))
    process.start()
    return process


def stop(process: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL (if still alive) and reap the broker process, by its pid."""
    assert process.pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)
    process.join(5)


async def fetch_all(address: str) -> dict[int, list[Message]]:
    found: dict[int, list[Message]] = {}
    async with connect(address) as client:
        for info in await client.partitions("orders"):
            messages: list[Message] = []
            offset = info.start_offset
            while offset < info.end_offset:
                batch = await client.fetch("orders", info.partition, offset, 256 * 1024)
                messages.extend(batch)
                offset = batch[-1].offset + 1
            found[info.partition] = messages
    return found


async def wait_until_serving(address: str, deadline: float) -> None:
    while True:
        try:
            async with connect(address):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.005)


def test_acknowledged_messages_survive_sigkill(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    config_path = tmp_path / "broky.toml"
    port = free_port()
    write_config(config_path, data_dir, port)
    address = f"127.0.0.1:{port}"
    rng = random.Random(5)
    acked: dict[int, int] = {}  # payload id -> partition
    next_id = 0
    started = time.monotonic()
    cycles = 0
    while cycles < CYCLES and time.monotonic() - started < BUDGET_SECONDS:
        process = start_broker(config_path)
        assert process.pid is not None
        try:
            next_id = trio.run(
                one_cycle, address, process.pid, rng.uniform(0.005, 0.08), acked, next_id
            )
        finally:
            stop(process)
        cycles += 1
    assert cycles >= CYCLES, f"only {cycles} kill cycles fit in {BUDGET_SECONDS} s"
    # A last restart, to check what the last kill left.
    process = start_broker(config_path)
    try:
        stored = trio.run(restart_and_read, address)
    finally:
        stop(process)
    check(stored, acked)
    assert len(acked) > 1000


async def restart_and_read(address: str) -> dict[int, list[Message]]:
    await wait_until_serving(address, time.monotonic() + 10)
    return await fetch_all(address)


def check(stored: dict[int, list[Message]], acked: dict[int, int]) -> None:
    seen: dict[int, tuple[int, int]] = {}
    for partition, messages in stored.items():
        offsets = [message.offset for message in messages]
        assert offsets == list(range(len(offsets))), f"partition {partition} is not dense"
        ids = [int(message.payload) for message in messages]
        for offset, payload_id in zip(offsets, ids, strict=True):
            assert payload_id not in seen, f"message {payload_id} is stored twice"
            seen[payload_id] = (partition, offset)
        acked_here = [payload_id for payload_id in ids if payload_id in acked]
        assert acked_here == sorted(acked_here), f"partition {partition} is out of order"
    missing = [payload_id for payload_id in acked if payload_id not in seen]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    for payload_id, partition in acked.items():
        assert seen[payload_id][0] == partition


async def one_cycle(
    address: str, pid: int, run_for: float, acked: dict[int, int], next_id: int
) -> int:
    """Start (recovering), check what is stored, publish with acks, be killed."""
    await wait_until_serving(address, time.monotonic() + 10)
    check(await fetch_all(address), acked)
    counter = next_id

    async def publish_until_killed() -> None:
        nonlocal counter
        try:
            # Not idempotent: this test gives up on the publisher at each
            # kill (idempotent retries are tests/faults/test_idempotent_kill.py's).
            async with connect(address, idempotent=False) as client:
                while True:
                    ids_by_key: dict[str, list[int]] = defaultdict(list)
                    for _ in range(random.randint(1, 60)):
                        key = f"orders.k{counter % 7}"
                        await client.publish(key, b"%d" % counter, ack=True)
                        ids_by_key[key].append(counter)
                        counter += 1
                    partitions: dict[str, list[int]] = defaultdict(list)
                    for ack in await client.flush_acks():
                        count = ack.last_offset - ack.first_offset + 1
                        partitions[ack.key].extend([ack.partition] * count)
                    for key, ids in ids_by_key.items():
                        assert len(partitions[key]) == len(ids)
                        acked.update(zip(ids, partitions[key], strict=True))
        except* (BrokyError, OSError):
            pass  # the broker was killed

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_until_killed)
        await trio.sleep(run_for)
        os.kill(pid, signal.SIGKILL)
    return counter
