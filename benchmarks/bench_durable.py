"""Durable publish end to end: acked publishes through a real broker process.

Run: ``.venv/bin/python -m benchmarks.bench_durable [--duration S] [--dir DIR]
[--keys MIX] [--workers N ...] [--broker-python PATH]``. Prints one JSON
object per line. A ``broky serve`` process (``--workers``, repeatable,
default 1; connections handed to the workers round-robin so the publishers
spread evenly) keeps topic ``bench.>`` durable (8 partitions) with the
policy under test; publisher connections in this process publish 100-byte
payloads with ``ack=True`` and count a message only once its ack arrived.
The key mix (``--keys``, repeatable) says how messages spread over keys:
``one`` (each
publisher its own key: long runs, the best case), ``many`` (each publisher
cycles ``bench.k0`` .. ``bench.k999``: runs of one message) or
``key_partition`` (one key, a distinct ``key_partition`` per message, so
consecutive messages land in different partitions). Then one
subscriber replays everything from the earliest offset (``Start.earliest()``,
decoding every message in the client), the replay read rate. In the same
run, ``raw_write_fsync`` measures this disk's ceiling (write + fdatasync of
1000-message runs, no broker, no log code), so the ratio survives a noisy
machine. With several workers each row also reports every worker's CPU
(cores) and the forwarded fraction: the share of acked messages whose
partition another worker than the publisher's owned (read from each
worker's ``broky_durable_forwarded_messages_total``).
Publishers are idempotent (the client's default: producer ids and sequences,
deduplicated by each partition's owner) unless ``--not-idempotent``, which
measures what idempotence costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import trio

from benchmarks.bench_storage import make_run, raw_writer
from benchmarks.interrupt import stop_children_on_signals
from broky import Start, connect
from broky.loadtest.servers import _children, _free_ports, cpu_seconds

PAYLOAD = b"x" * 100
PUBLISHERS = 8
#: Messages a publisher queues before waiting for their acks (its window).
WINDOW = 20_000
#: Keys cycled by the ``many`` mix.
MANY_KEYS = 1000
KEY_MIXES = ("one", "many", "key_partition")
#: The longest a replay of everything published may take before its row
#: ends with what did not arrive counted as lost.
REPLAY_BOUND_SECONDS = 120


def write_config(
    path: Path, data_dir: Path, fsync: str, workers: int = 1, metrics_port: int = 0
) -> None:
    spread = f'accept = "handoff"\nmetrics_listen = true\nmetrics_port = {metrics_port}\n'
    path.write_text(
        f'host = "127.0.0.1"\nport = 0\nworkers = {workers}\nlog_level = "warning"\n'
        + (spread if workers > 1 else "")
        + f'data_dir = "{data_dir}"\nsystem_events = false\nsystem_metrics_interval = 0\n'
        f'[[durable]]\nname = "bench"\npattern = "bench.>"\npartitions = {PUBLISHERS}\n'
        f'fsync = "{fsync}"\n'
    )


def key_mix(mix: str, index: int) -> list[tuple[str, bytes]]:
    """One window's (key, key_partition) per message of publisher ``index``."""
    if mix == "one":
        return [(f"bench.p{index}", b"")] * WINDOW
    if mix == "many":
        return [(f"bench.k{n % MANY_KEYS}", b"") for n in range(WINDOW)]
    if mix == "key_partition":
        return [(f"bench.p{index}", b"%d" % n) for n in range(WINDOW)]
    raise ValueError(f"unknown key mix {mix!r}; known: {', '.join(KEY_MIXES)}")


async def publisher(
    address: str,
    index: int,
    deadline: float,
    counts: list[list[int]],
    mix: str,
    idempotent: bool = True,
) -> None:
    """Publish windows of acked messages until ``deadline``; ``counts[index]``
    holds [published, acked]."""
    messages = key_mix(mix, index)
    async with connect(address, name=f"bench-{index}", idempotent=idempotent) as client:
        while time.monotonic() < deadline:
            for key, key_partition in messages:
                await client.publish(key, PAYLOAD, key_partition=key_partition, ack=True)
            counts[index][0] += len(messages)
            acked = await client.flush_acks()
            counts[index][1] += acked.messages


def worker_cpu(pid: int) -> list[float]:
    """CPU seconds of each worker process (the process itself with one worker)."""
    workers = sorted(_children(pid)) or [pid]
    return [cpu_seconds(worker) for worker in workers]


def forwarded_messages(metrics_ports: list[int]) -> int:
    """The workers' ``broky_durable_forwarded_messages_total``, summed."""
    total = 0
    for port in metrics_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
            for line in page.read().decode().splitlines():
                if line.startswith("broky_durable_forwarded_messages_total"):
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def measure(
    address: str,
    duration: float,
    pid: int,
    mix: str,
    replay: bool,
    metrics_ports: list[int] | None = None,
    idempotent: bool = True,
) -> dict[str, object]:
    """Acked publish rate and the cores the broker (each worker) and this
    client used meanwhile, then (with ``replay``) the rate of a replay of
    everything from the earliest offset."""
    counts = [[0, 0] for _ in range(PUBLISHERS)]
    server_before, client_before = cpu_seconds(pid), time.process_time()
    workers_before = worker_cpu(pid)
    forwarded_before = forwarded_messages(metrics_ports) if metrics_ports else 0
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        for index in range(PUBLISHERS):
            nursery.start_soon(publisher, address, index, start + duration, counts, mix, idempotent)
    elapsed = time.monotonic() - start
    workers_cpu = [
        round((after - before) / elapsed, 2)
        for before, after in zip(workers_before, worker_cpu(pid), strict=False)
    ]
    forwarded = (forwarded_messages(metrics_ports) if metrics_ports else 0) - forwarded_before
    published = sum(count[0] for count in counts)
    acked = sum(count[1] for count in counts)
    server_seconds = cpu_seconds(pid) - server_before
    figures: dict[str, object] = {
        "keys": mix,
        "idempotent": idempotent,
        "msgs_per_s": round(acked / elapsed),
        "published": published,
        "acked": acked,
        "lost": published - acked,
        "server_cpu": round(server_seconds / elapsed, 2),
        "client_cpu": round((time.process_time() - client_before) / elapsed, 2),
        # The broker's CPU per acked message: what the code costs, whatever
        # share of this shared machine the run happened to get.
        "server_us_per_msg": round(server_seconds / max(acked, 1) * 1e6, 2),
        "worker_cpu": workers_cpu,
        "forwarded_fraction": round(forwarded / acked, 3) if acked else 0.0,
    }
    if not replay:
        return figures
    async with connect(address, name="bench-replay") as client:
        total = sum(info.end_offset - info.start_offset for info in await client.partitions())
        start = time.monotonic()
        received = 0
        # Bounded: a replay that stops short (a lost message) ends the row
        # with its loss reported instead of waiting forever.
        with trio.move_on_after(REPLAY_BOUND_SECONDS):
            async with client.subscription("bench.>", start=Start.earliest()) as subscription:
                async for _ in subscription:
                    received += 1
                    if received == total:
                        break
        figures["replay_msgs_per_s"] = round(received / (time.monotonic() - start))
        figures["replay_lost"] = total - received
    return figures


def broker_rate(
    root: Path,
    fsync: str,
    duration: float,
    mix: str = "one",
    replay: bool = True,
    workers: int = 1,
    broker_python: str = sys.executable,
    idempotent: bool = True,
) -> dict[str, object]:
    """Run ``measure`` against a fresh broker with its own data directory,
    started by ``broker_python`` (another checkout's interpreter: an A/B of
    two versions of the broker against the same client)."""
    name = f"{fsync}-{mix}-w{workers}"
    config = root / f"{name}.toml"
    metrics_port = _free_ports(workers) if workers > 1 else 0
    write_config(config, root / f"data-{name}", fsync, workers, metrics_port)
    ports = list(range(metrics_port, metrics_port + workers)) if workers > 1 else None
    process = subprocess.Popen(
        [broker_python, "-m", "broky", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        address = line.strip().rsplit(" ", 1)[-1]
        return trio.run(measure, address, duration, process.pid, mix, replay, ports, idempotent)
    finally:
        process.terminate()
        process.wait(10)


def emit(scenario: str, **fields: object) -> None:
    print(json.dumps({"scenario": scenario, **fields}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per scenario")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument(
        "--keys", action="append", choices=KEY_MIXES,
        help="key mix of fsync=always (repeatable; default: all three)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", action="append", type=int,
        help="worker processes of the broker (repeatable; default: 1)",
    )  # fmt: skip
    parser.add_argument(
        "--not-idempotent",
        action="store_true",
        help="publish without producer ids (what idempotence costs, by difference)",
    )
    parser.add_argument(
        "--broker-python",
        default=sys.executable,
        help="interpreter that runs the broker (e.g. another checkout's .venv/bin/python)",
    )
    args = parser.parse_args()
    stop_children_on_signals()
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        root = Path(name)
        group = [make_run(1000)]
        fd = os.open(root / "raw", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            raw, _ = raw_writer(fd, group)
            raw.run_for(args.duration)
        finally:
            os.close(fd)
        emit("raw_write_fsync", messages_per_fsync=1000, msgs_per_s=raw.rate)
        summary: dict[str, object] = {"raw_write_fsync_msgs_per_s": raw.rate}
        runs = [("always", mix) for mix in args.keys or KEY_MIXES] + [("interval", "one")]
        for workers in args.workers or [1]:
            suffix = f"_w{workers}" if args.workers else ""
            for fsync, mix in runs:
                figures = broker_rate(
                    root,
                    fsync,
                    args.duration,
                    mix,
                    replay=mix == "one",
                    workers=workers,
                    broker_python=args.broker_python,
                    idempotent=not args.not_idempotent,
                )
                replay_rate = figures.pop("replay_msgs_per_s", None)
                replay_lost = figures.pop("replay_lost", 0)
                rate = figures["msgs_per_s"]
                assert isinstance(rate, int)
                emit(
                    f"broker_acked_fsync_{fsync}",
                    workers=workers,
                    publishers=PUBLISHERS,
                    window=WINDOW,
                    **figures,
                    ratio_to_raw=round(rate / raw.rate, 2),
                )
                summary[f"acked_{fsync}_{mix}{suffix}_msgs_per_s"] = rate
                if replay_rate is not None and fsync == "always":
                    emit(
                        "broker_replay_earliest",
                        workers=workers,
                        msgs_per_s=replay_rate,
                        lost=replay_lost,
                    )
                    summary[f"replay{suffix}_msgs_per_s"] = replay_rate
    emit("summary", **summary)


if __name__ == "__main__":
    main()
