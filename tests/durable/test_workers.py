"""Durable topics through ``broky serve --workers N``: real worker processes.

Connections are handed to the workers round-robin (``accept = "handoff"``),
so consecutive connections land on consecutive workers and every worker
serves publishers and subscribers of partitions it does not own. Every
process is started here, on 127.0.0.1, and killed by PID when the test ends.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from broky import BrokyError, Client, ConnectionClosed, Message, Start, connect
from broky.storage.topics import partition_for
from tests.mesh.test_nodes import Node, nodes

pytestmark = pytest.mark.slow

PARTITIONS = 8
#: Kill cycles of the fault test and the bound of the whole loop: it stops
#: early rather than run long, and falling short of MIN_CYCLES fails it.
CYCLES = 20
MIN_CYCLES = 12
#: ~35 s here alone, 54 s with the suite's other pytest worker busy.
BUDGET_SECONDS = 90.0
#: Most seconds a kill waits for the publishers to make progress (kill_workers).
PROGRESS_SECONDS = 1.0
#: Owner kills while frames are in flight in the answered-publish test.
KILLS_WHILE_PUBLISHING = 6


def write_config(path: Path, workers: int) -> None:
    path.write_text(
        f'host = "127.0.0.1"\nport = 0\nworkers = {workers}\naccept = "handoff"\n'
        f'log_level = "error"\ndata_dir = "{path.parent / "data"}"\nsystem_events = false\n'
        "system_metrics_interval = 0\n[[durable]]\n"
        f'name = "orders"\npattern = "orders.>"\npartitions = {PARTITIONS}\nfsync = "always"\n'
        "segment_bytes = 65536\n"
    )


KEYS = [
    next(
        f"orders.k{n}"
        for n in range(10_000)
        if partition_for(f"orders.k{n}".encode(), PARTITIONS) == partition
    )
    for partition in range(PARTITIONS)
]


async def fetch_all(client: Client) -> dict[int, list[Message]]:
    found: dict[int, list[Message]] = {}
    for info in await client.partitions("orders"):
        messages: list[Message] = []
        offset = info.start_offset
        while offset < info.end_offset:
            batch = await client.fetch("orders", info.partition, offset, 256 * 1024)
            assert batch, "fetch returned nothing before the end"
            messages.extend(batch)
            offset = batch[-1].offset + 1
        found[info.partition] = messages
    return found


@pytest.mark.parametrize("workers", [2, 3])
async def test_every_worker_publishes_and_reads_every_partition(
    tmp_path: Path, workers: int
) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, workers)
    with nodes() as start, trio.fail_after(30):
        node = start(["--config", str(config)])
        async with AsyncExitStack() as stack:
            # Two connections per worker; the first subscribes before anything
            # is published and gets the rest live, wherever it was published.
            clients = [
                await stack.enter_async_context(connect(node.address, name=f"c{index}"))
                for index in range(2 * workers)
            ]
            live = await stack.enter_async_context(
                clients[0].subscribe("orders.>", start=Start.earliest())
            )
            acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
            for round_ in range(3):
                for index, client in enumerate(clients):
                    sent: dict[str, list[bytes]] = defaultdict(list)
                    for n in range(40):
                        key = KEYS[(n + index) % PARTITIONS]
                        payload = b"%d-%d-%d" % (index, round_, n)
                        await client.publish(key, payload, ack=True)
                        sent[key].append(payload)
                    for ack in await client.flush_acks():
                        payloads = sent[ack.key][: ack.last_offset - ack.first_offset + 1]
                        del sent[ack.key][: len(payloads)]
                        offsets = range(ack.first_offset, ack.last_offset + 1)
                        acked[ack.partition].extend(zip(offsets, payloads, strict=True))
            total = 3 * 2 * workers * 40
            assert sum(len(items) for items in acked.values()) == total
            for items in acked.values():
                assert sorted(offset for offset, _ in items) == list(range(len(items)))
            expected = {p: [payload for _, payload in sorted(items)] for p, items in acked.items()}
            # Every worker reads every partition back exactly as acked.
            for client in clients[:workers]:
                found = await fetch_all(client)
                assert {p: [m.payload for m in ms] for p, ms in found.items()} == expected
            # The subscriber got everything live, in offset order per partition.
            received: dict[int, list[Message]] = defaultdict(list)
            count = 0
            async for message in live:
                received[message.partition].append(message)
                count += 1
                if count == total:
                    break
            for partition, messages in received.items():
                assert [m.offset for m in messages] == list(range(len(messages)))
                assert [m.payload for m in messages] == expected[partition]
            # A replay from the earliest offset, on another worker, is exact too.
            async with clients[1].subscribe("orders.>", start=Start.earliest()) as replay:
                replayed: dict[int, list[bytes]] = defaultdict(list)
                count = 0
                async for message in replay:
                    replayed[message.partition].append(message.payload)
                    count += 1
                    if count == total:
                        break
            assert dict(replayed) == expected


async def publish_until_cancelled(
    address: str, index: int, acked: dict[bytes, int], failures: list[int]
) -> None:
    """Publish acked frames over every partition, reconnecting after a lost
    connection; record what was acked (payload -> partition)."""
    counter = 0
    while True:
        try:
            async with connect(address, name=f"p{index}") as client:
                while True:
                    sent: dict[str, list[bytes]] = defaultdict(list)
                    for _ in range(random.randint(8, 40)):
                        key = KEYS[counter % PARTITIONS]
                        payload = b"%d-%d" % (index, counter)
                        await client.publish(key, payload, ack=True)
                        sent[key].append(payload)
                        counter += 1
                    try:
                        acks = await client.flush_acks()
                    except BrokyError:
                        failures[0] += 1  # e.g. OwnerUnavailable: not acked, go on
                        await trio.sleep(0.02)
                        continue
                    for ack in acks:
                        count = ack.last_offset - ack.first_offset + 1
                        for payload in sent[ack.key][:count]:
                            acked[payload] = ack.partition
                        del sent[ack.key][:count]
        except (BrokyError, OSError):
            failures[0] += 1
            await trio.sleep(0.05)  # our worker was killed: reconnect


#: Seconds an acked publish may go unanswered in all_partitions_writable:
#: the broker answers at once when an owner is down and after its fsync
#: otherwise, so only a lost answer (or a stalled owner) takes this long.
ANSWER_SECONDS = 5.0


async def all_partitions_writable(address: str, deadline: float) -> int:
    """Wait until an acked publish to every partition succeeds (all owners
    up); how many tries failed meanwhile (an error answered, or no connection).

    The probe is not idempotent, so every answer reaches it: an ack, or the
    OwnerUnavailable of a worker still restarting, upon which it tries again
    until ``deadline``. An idempotent client would resend in silence for up
    to its ``retry_timeout``, and a restart slower than ANSWER_SECONDS would
    look like an unanswered publish (the fault test's old flake)."""
    failed = 0
    while True:
        try:
            async with connect(address, name="probe", idempotent=False) as client:
                for key in KEYS:
                    await client.publish(key, b"probe", ack=True)
                with trio.move_on_after(ANSWER_SECONDS):  # unanswered: fails below
                    await client.flush_acks()
                    return failed
                raise AssertionError("an acked publish was never answered")
        except (BrokyError, OSError):
            failed += 1
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.05)


async def kill_workers(
    node: Node,
    rng: random.Random,
    cycles: int,
    until: float,
    pause: tuple[float, float],
    progress: Callable[[], int] | None = None,
) -> int:
    """SIGKILL a random worker of ``node`` up to ``cycles`` times until the
    monotonic time ``until``, each time once every partition is writable
    again and after a random ``pause``; how many times. Returns once every
    partition is writable again.

    With ``progress`` (say, how many messages were acked so far) each kill
    also waits, at most PROGRESS_SECONDS, until it grew since the owner came
    back, so that it meets publishers at work rather than still pausing
    between their retries (the probe sees the owner back sooner than they do)."""
    done = 0
    while done < cycles and time.monotonic() < until:
        await all_partitions_writable(node.address, time.monotonic() + 15)
        if progress is not None:
            before = progress()
            with trio.move_on_after(PROGRESS_SECONDS):
                while progress() == before:  # noqa: ASYNC110 - a checker's poll
                    await trio.sleep(0.01)
        await trio.sleep(rng.uniform(*pause))
        os.kill(rng.choice(node.workers()), signal.SIGKILL)
        done += 1
    await all_partitions_writable(node.address, time.monotonic() + 15)
    return done


async def replacement(node: Node, dead: int) -> int:
    """The PID of the worker the supervisor starts in place of ``dead``
    (polled: it appears after the supervisor's restart delay)."""
    others = set(node.workers()) - {dead}
    with trio.fail_after(10):
        while True:
            started = set(node.workers()) - others - {dead}
            if started:
                return started.pop()
            await trio.sleep(0.005)


async def stop_for(pid: int, seconds: float) -> None:
    """Hold ``pid`` stopped for ``seconds`` (a worker slow to start)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await trio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


#: How long the replacement of a killed worker is held back in the slow
#: restart test: longer than all_partitions_writable's bound on one answer.
SLOW_START_SECONDS = 7.0


async def test_a_slow_restart_is_waited_for_not_taken_for_an_unanswered_publish(
    tmp_path: Path,
) -> None:
    """The flake of the fault test: a killed worker whose replacement takes
    longer than the probe's 5 s bound to serve (a loaded machine) made an
    idempotent probe's ``flush_acks`` keep resending in silence, though the
    broker answered every attempt at once with OwnerUnavailable. The probe
    must see those answers and wait for the owner, failing only on a publish
    that really goes unanswered."""
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    with nodes() as start, trio.fail_after(40):
        node = start(["--config", str(config)])
        await all_partitions_writable(node.address, time.monotonic() + 15)
        victim = max(node.workers())
        os.kill(victim, signal.SIGKILL)
        async with trio.open_nursery() as nursery:

            async def hold_back_replacement() -> None:
                await stop_for(await replacement(node, victim), SLOW_START_SECONDS)

            nursery.start_soon(hold_back_replacement)
            # Before the replacement exists, every connection lands on the
            # survivor, which answers for the dead owner's partitions.
            started = time.monotonic()
            failed = await all_partitions_writable(node.address, started + 30)
            waited = time.monotonic() - started
    assert waited > SLOW_START_SECONDS - 1
    assert failed > 0  # answered, with OwnerUnavailable, while it waited
    print(f"waited={waited:.1f}s failed_tries={failed}")


async def read_back(address: str, deadline: float) -> dict[int, list[Message]]:
    """Every partition, read through whichever worker the connection lands
    on (retried while that worker's channel to a restarted owner is down)."""
    while True:
        try:
            async with connect(address, name="reader") as client:
                return await fetch_all(client)
        except (BrokyError, OSError):
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.05)


async def test_sigkilled_workers_lose_no_acknowledged_message(tmp_path: Path) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    rng = random.Random(14)
    acked: dict[bytes, int] = {}
    failures = [0]
    with nodes() as start:
        node: Node = start(["--config", str(config)])
        started = time.monotonic()
        with trio.fail_after(BUDGET_SECONDS + 30):
            async with trio.open_nursery() as nursery:
                for index in range(4):  # two publishers on each worker
                    nursery.start_soon(
                        publish_until_cancelled, node.address, index, acked, failures
                    )
                cycles = await kill_workers(
                    node,
                    rng,
                    CYCLES,
                    started + BUDGET_SECONDS,
                    pause=(0.05, 0.4),
                    progress=lambda: len(acked),
                )
                nursery.cancel_scope.cancel()
            stored = await read_back(node.address, time.monotonic() + 15)
    assert cycles >= MIN_CYCLES, f"only {cycles} kill cycles fit in {BUDGET_SECONDS} s"
    seen: dict[bytes, int] = {}
    for partition, messages in stored.items():
        assert [m.offset for m in messages] == list(range(len(messages))), partition
        for message in messages:
            if message.payload != b"probe":
                assert message.payload not in seen, f"{message.payload!r} stored twice"
                seen[message.payload] = partition
        # Per publisher, acked messages keep their publish order in each partition.
        order: dict[bytes, list[int]] = defaultdict(list)
        for message in messages:
            if message.payload in acked:
                publisher, number = message.payload.split(b"-")
                order[publisher].append(int(number))
        for numbers in order.values():
            assert numbers == sorted(numbers)
    lost = [payload for payload, partition in acked.items() if seen.get(payload) != partition]
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    assert len(acked) > 1000
    print(f"cycles={cycles} acked={len(acked)} failed_frames={failures[0]}")


async def publish_answered_frames(address: str, outcomes: Counter[str]) -> None:
    """Publish acked frames over every partition, one at a time, with a
    client that is not idempotent (every answer reaches it), and tally each
    frame's answer: ``acked``, the error's code, ``closed`` (our worker
    died), or ``unanswered`` after ANSWER_SECONDS."""
    while True:
        try:
            async with connect(address, name="answers", idempotent=False) as client:
                while True:
                    for key in KEYS:
                        await client.publish(key, b"answered", ack=True)
                    with trio.move_on_after(ANSWER_SECONDS):
                        try:
                            await client.flush_acks()
                            outcomes["acked"] += 1
                        except ConnectionClosed:
                            raise
                        except BrokyError as exc:
                            outcomes[exc.code.name] += 1
                            await trio.sleep(0.01)  # the owner is still restarting
                        continue
                    outcomes["unanswered"] += 1
                    return
        except (ConnectionClosed, OSError):
            outcomes["closed"] += 1
            await trio.sleep(0.02)


async def test_every_acked_publish_is_answered_when_its_owner_is_sigkilled(
    tmp_path: Path,
) -> None:
    """The promise behind the probe: a forwarded acked publish in flight
    when its owner dies, and one sent while the owner restarts, is answered
    at once with OwnerUnavailable (retriable), never left waiting."""
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    outcomes: Counter[str] = Counter()
    rng = random.Random(7)
    with nodes() as start, trio.fail_after(60):
        node = start(["--config", str(config)])
        await all_partitions_writable(node.address, time.monotonic() + 15)
        async with trio.open_nursery() as nursery:
            for _ in range(4):  # two on each worker
                nursery.start_soon(publish_answered_frames, node.address, outcomes)
            for _ in range(KILLS_WHILE_PUBLISHING):
                await trio.sleep(rng.uniform(0.2, 0.6))
                os.kill(rng.choice(node.workers()), signal.SIGKILL)
                await all_partitions_writable(node.address, time.monotonic() + 15)
            nursery.cancel_scope.cancel()
    print(dict(outcomes))
    assert outcomes["unanswered"] == 0, dict(outcomes)
    assert outcomes["OWNER_UNAVAILABLE"] > 0  # frames met a dead owner
    assert outcomes["acked"] > 0
